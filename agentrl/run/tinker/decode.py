"""Sample `num_samples` continuations of one prompt with the active adapter (KV cache, batched).

Token choice and behaviour log-probs are agentrl's sampler math
(:func:`agentrl.samplers.sampling.sample_next`: ``log_softmax(logits / T)`` at the chosen
token, before top-k / top-p truncation). Prompt log-probs come from the same prefill.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import torch

from agentrl.models import cache_kwargs, returned_cache
from agentrl.run.tinker.wire import Sequence
from agentrl.samplers.base import SamplingParams
from agentrl.samplers.sampling import sample_next


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


@torch.no_grad()
def decode(
    model: Any,
    prompt: list[int],
    num_samples: int,
    params: DecodeParams,
    prompt_logprobs: bool,
    device: torch.device,
) -> tuple[list[Sequence], list[float] | None]:
    row = SamplingParams(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        max_new_tokens=params.max_tokens,
    )
    rng = torch.Generator().manual_seed(
        params.seed if params.seed is not None else secrets.randbits(63)
    )
    ids = torch.tensor([prompt], device=device)
    out = model(input_ids=ids, use_cache=True)
    logits = out.logits[0]
    scored: list[float] | None = None
    if prompt_logprobs:
        lp = torch.log_softmax(logits[:-1].float(), dim=-1)
        picked = lp.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)
        scored = [float("nan"), *picked.tolist()]
    cache = returned_cache(out)
    if num_samples > 1:
        cache.batch_repeat_interleave(num_samples)
    last = logits[-1:].expand(num_samples, -1)
    tokens: list[list[int]] = [[] for _ in range(num_samples)]
    logps: list[list[float]] = [[] for _ in range(num_samples)]
    stopped = [False] * num_samples
    done = [False] * num_samples
    mask = torch.ones(num_samples, len(prompt), dtype=torch.long, device=device)
    for _ in range(params.max_tokens):
        chosen, chosen_lp, _ = sample_next(last, [row] * num_samples, [None] * num_samples, rng)
        for i in range(num_samples):
            if done[i]:
                continue
            tokens[i].append(chosen[i])
            logps[i].append(chosen_lp[i])
            if chosen[i] in params.stop_tokens or _stop_string(tokens[i], params):
                done[i] = stopped[i] = True
            elif len(tokens[i]) >= params.max_tokens:
                done[i] = True
        if all(done):
            break
        mask = torch.cat([mask, torch.ones(num_samples, 1, dtype=torch.long, device=device)], 1)
        step = torch.tensor(chosen, device=device).unsqueeze(-1)
        out = model(
            input_ids=step, attention_mask=mask, use_cache=True, **cache_kwargs(model, cache)
        )
        cache = returned_cache(out)
        last = out.logits[:, -1]
    seqs = [Sequence(t, lp, s) for t, lp, s in zip(tokens, logps, stopped, strict=True)]
    return seqs, scored


def _stop_string(tokens: list[int], params: DecodeParams) -> bool:
    if not params.stop_strings or params.decode_text is None:
        return False
    text = params.decode_text(tokens[-16:])  # a stop string ends within the last few tokens
    return any(text.endswith(s) or s in text for s in params.stop_strings)
