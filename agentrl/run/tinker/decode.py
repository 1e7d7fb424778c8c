"""Decode many sampling requests together: rows of different prompts, adapters and params.

Every request's ``num_samples`` rows join one batch with the other queued requests' rows;
prompts are left-padded (positions from the attention mask) and each row names its LoRA
adapter, which peft applies per row (``adapter_names``; ``__base__`` is the base model),
so clients of different adapters share each forward pass. Token choice and behaviour
log-probs are agentrl's sampler math (:func:`agentrl.samplers.sampling.sample_next`:
``log_softmax(logits / T)`` at the chosen token, before top-k / top-p truncation).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from agentrl.models import returned_cache
from agentrl.run.tinker.wire import Sequence
from agentrl.samplers.base import SamplingParams
from agentrl.samplers.sampling import sample_next

BASE = "__base__"  # peft's name for "no adapter" in a mixed batch


@dataclass(frozen=True)
class DecodeParams:
    max_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_tokens: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    decode_text: Any = None  # tokenizer.decode, for stop strings


@dataclass
class Request:
    """One sample request: `num_samples` continuations of `prompt` with `adapter`."""

    prompt: list[int]
    num_samples: int
    params: DecodeParams
    adapter: str = BASE
    prompt_logprobs: bool = False


Forward = Callable[..., Any]  # forward(input_ids, attention_mask, position_ids, adapters, cache)


@torch.no_grad()
def prompt_logprobs(forward: Forward, request: Request, device: torch.device) -> list[float]:
    """log p(prompt[i] | prompt[:i]) for i >= 1, NaN at position 0 (Tinker's layout)."""
    ids = torch.tensor([request.prompt], device=device)
    logits = forward(ids, torch.ones_like(ids), None, [request.adapter], None).logits[0]
    lp = torch.log_softmax(logits[:-1].float(), dim=-1)
    picked = lp.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)
    return [float("nan"), *picked.tolist()]


@torch.no_grad()
def decode(
    forward: Forward, requests: list[Request], device: torch.device, seed: int | None = None
) -> list[list[Sequence]]:
    """Each request's sequences, all rows decoded in one batch (`seed`: the draws of the
    unseeded rows; random when None)."""
    rows = [(r, i) for r in requests for i in range(r.num_samples)]
    width = max(len(r.prompt) for r in requests)
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for k, (r, _) in enumerate(rows):
        ids[k, width - len(r.prompt) :] = torch.tensor(r.prompt, device=device)
        mask[k, width - len(r.prompt) :] = 1
    params = [
        SamplingParams(
            temperature=r.params.temperature,
            top_p=r.params.top_p,
            top_k=r.params.top_k,
            max_new_tokens=r.params.max_tokens,
        )
        for r, _ in rows
    ]
    # a seeded request draws each of its rows from its own generator
    generators = [
        torch.Generator().manual_seed(r.params.seed * 100_003 + i)
        if r.params.seed is not None
        else None
        for r, i in rows
    ]
    rng = torch.Generator().manual_seed(secrets.randbits(63) if seed is None else seed)
    adapters = [r.adapter for r, _ in rows]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = forward(ids, mask, positions, adapters, None)
    cache, last = returned_cache(out), out.logits[:, -1]
    tokens: list[list[int]] = [[] for _ in rows]
    logps: list[list[float]] = [[] for _ in rows]
    stopped = [False] * len(rows)
    done = [False] * len(rows)
    position = positions[:, -1:]
    for _ in range(max(r.params.max_tokens for r in requests)):
        chosen, chosen_lp, _ = sample_next(last, params, generators, rng)
        for k, (r, _) in enumerate(rows):
            if done[k]:
                continue
            tokens[k].append(chosen[k])
            logps[k].append(chosen_lp[k])
            if chosen[k] in r.params.stop_tokens or _stop_string(tokens[k], r.params):
                done[k] = stopped[k] = True
            elif len(tokens[k]) >= r.params.max_tokens:
                done[k] = True
        if all(done):
            break
        mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=torch.long, device=device)], 1)
        position = position + 1
        step = torch.tensor(chosen, device=device).unsqueeze(-1)
        out = forward(step, mask, position, adapters, cache)
        cache, last = returned_cache(out), out.logits[:, -1]
    results: list[list[Sequence]] = []
    k = 0
    for r in requests:
        results.append(
            [Sequence(tokens[k + i], logps[k + i], stopped[k + i]) for i in range(r.num_samples)]
        )
        k += r.num_samples
    return results


def _stop_string(tokens: list[int], params: DecodeParams) -> bool:
    if not params.stop_strings or params.decode_text is None:
        return False
    text = params.decode_text(tokens[-16:])  # a stop string ends within the last few tokens
    return any(s in text for s in params.stop_strings)
