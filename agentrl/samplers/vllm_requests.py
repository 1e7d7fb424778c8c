"""Requests to and outputs from vLLM's engine in the :class:`Sampler` contract: a prompt
checked, our :class:`SamplingParams` as vLLM's, and a vLLM ``CompletionOutput`` as a
:class:`Generation` (behaviour log-probs, top-k entropy, per-token weight versions). The
log-prob and entropy definitions are explained in :mod:`agentrl.samplers.vllm`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from agentrl.errors import PromptError, SamplerError
from agentrl.samplers.base import FinishReason, Generation, SamplingParams


def check_prompt(
    prompt_ids: Sequence[int], params: SamplingParams, vocab: int, limit: int | None
) -> list[int]:
    """`prompt_ids` as ints, or a PromptError saying what is wrong with them."""
    ids = [int(t) for t in prompt_ids]
    if not ids:
        raise PromptError("prompt_ids is empty: pass at least one token id")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise PromptError(f"prompt_ids has ids outside the vocabulary [0, {vocab}): {bad[:5]}")
    if limit is not None and len(ids) >= limit:
        raise PromptError(
            f"prompt has {len(ids)} tokens but the context is {limit}: shorten the prompt "
            "or raise the sampler's max_model_len"
        )
    if params.n != 1:
        raise ValueError(
            f"generate() samples one continuation (got n={params.n}); use generate_many()"
        )
    return ids


def vllm_params(params: SamplingParams, entropy_top_k: int, ignore_eos: bool) -> Any:
    """vLLM's ``SamplingParams`` for ours: one final output, top-k log-probs for entropy."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VSamplingParams(
        n=1,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        max_tokens=params.max_new_tokens,
        stop_token_ids=list(params.stop_token_ids),
        stop=list(params.stop),
        include_stop_str_in_output=True,
        seed=params.seed,
        logprobs=entropy_top_k if params.return_entropy else 0,
        ignore_eos=ignore_eos,
        skip_special_tokens=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def to_generation(
    out: Any, params: SamplingParams, start_version: int, entropy_top_k: int, on_update: str
) -> Generation:
    """A vLLM ``CompletionOutput`` as a :class:`Generation`."""
    token_ids = list(out.token_ids)
    logprobs: list[float] = []
    entropies: list[float] | None = [] if params.return_entropy else None
    for token, top in zip(token_ids, out.logprobs or [], strict=False):
        logprobs.append(float(top[token].logprob))
        if entropies is not None:
            entropies.append(
                topk_entropy(
                    [
                        lp.logprob
                        for t, lp in top.items()
                        if lp.rank is not None and lp.rank <= entropy_top_k
                    ]
                )
            )
    if len(logprobs) != len(token_ids):
        raise SamplerError(f"vLLM returned {len(logprobs)} logprobs for {len(token_ids)} tokens")
    versions = span_versions(out.weight_versions, len(token_ids), start_version)
    finish: FinishReason = (
        out.finish_reason if out.finish_reason in ("stop", "length", "abort") else "stop"
    )
    truncated = params.temperature > 0 and (params.top_p < 1 or params.top_k > 0)
    return Generation(
        token_ids=token_ids,
        logprobs=logprobs,
        versions=versions,
        finish_reason=finish,
        entropies=entropies,
        text=out.text or "",
        metadata={
            "logprobs": "truncated" if truncated else "exact",
            "stop_reason": out.stop_reason,
            # a swap preempts running sequences; they recompute their KV on the new
            # weights (reset_prefix_cache(reset_running_requests=True), see VLLMSampler._swap)
            "on_update": on_update,
        },
    )


def topk_entropy(top_logprobs: Sequence[float]) -> float:
    """Entropy lower bound from the top-k log-probs; the tail is lumped into one outcome."""
    probs = [math.exp(lp) for lp in top_logprobs if lp > -math.inf]
    entropy = -sum(p * math.log(p) for p in probs if p > 0)
    rest = 1.0 - sum(probs)
    if rest > 1e-12:
        entropy -= rest * math.log(rest)
    return entropy


def span_versions(spans: Any, n_tokens: int, fallback: int) -> list[int]:
    """Per-token weight versions from vLLM's version spans (`fallback` where none says)."""
    if not spans:
        return [fallback] * n_tokens
    versions = [fallback] * n_tokens
    for span in spans:
        try:
            label = int(span.version)
        except (TypeError, ValueError):
            label = fallback
        for i in range(span.start, min(span.end, n_tokens)):
            versions[i] = label
    return versions
