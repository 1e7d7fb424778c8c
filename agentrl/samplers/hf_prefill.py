"""The hf sampler's batched prefill, on top of the prefix cache.

A chunk of plans (request, tokens to forward, how many of them the prefix cache holds)
is forwarded in one pass: rows left-padded to the longest sequence, each distinct sequence
once (a GRPO group's identical prompts share a row), the reused prefix seeded from the
prefix cache. What was forwarded is offered back to the prefix cache (:func:`remember`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers.cache_utils import Cache

from agentrl.models import cache_kwargs, returned_cache
from agentrl.samplers.hf_requests import Plan
from agentrl.samplers.prefix_cache import PrefixCache, Shared


def chunks(plans: list[Plan], budget: int) -> list[list[Plan]]:
    """`plans` in prefill chunks of at most `budget` (padded) tokens, sorted by the length
    left to forward so a chunk's rows need similar work."""
    plans = sorted(plans, key=lambda p: len(p[1]) - p[2])
    out: list[list[Plan]] = []
    while plans:
        chunk: list[Plan] = []
        while plans and (
            not chunk or (len(plans[0][1]) - plans[0][2]) * (len(chunk) + 1) <= budget
        ):
            chunk.append(plans.pop(0))
        out.append(chunk)
    return out


def forward(
    model: Any,
    chunk: list[Plan],
    *,
    new_cache: Callable[[], Cache],
    prefix: PrefixCache,
    device: torch.device,
) -> tuple[Any, list[int], int, torch.Tensor, int]:
    """Forward the plans' tokens (each distinct sequence once) on top of the cached
    prefixes: (cache, left pads, padded length, last logits, tokens forwarded), one row
    per plan.

    Rows are left-padded to the longest sequence `L`; the last `Q` positions (the longest
    part any row must forward) are fed, the first ``L - Q`` come from the prefix cache.
    A row with less left to forward re-feeds a few cached tokens instead.
    """
    distinct: dict[tuple[int, ...], int] = {}
    plans: list[Plan] = []
    row_of = []  # the distinct sequence each plan forwards with
    for plan in chunk:
        row_of.append(distinct.setdefault(tuple(plan[1]), len(plans)))
        if row_of[-1] == len(plans):
            plans.append(plan)
    longest = max(len(t) for _, t, _, _ in plans)
    fed = max(len(t) - reused for _, t, reused, _ in plans)
    past = longest - fed
    pads = [longest - len(t) for _, t, _, _ in plans]
    ids = torch.tensor(
        [([0] * p + t)[past:] for p, (_, t, _, _) in zip(pads, plans, strict=True)],
        device=device,
    )
    mask = attention_mask(pads, longest, device)
    positions = (mask.cumsum(-1) - 1).clamp_(min=0)[:, past:]
    if not any(pads):
        mask = None  # no padding: the model's plain causal path is faster
    cache = new_cache()
    if past:
        seed_cache(cache, plans, pads, past)
    with torch.inference_mode():
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **cache_kwargs(model, cache),
        )
    cache = returned_cache(out)
    forwarded = ids.numel() - sum(max(0, p - past) for p in pads)
    remember(
        prefix,
        [(t, row, pads[row]) for row, (_, t, _, _) in enumerate(plans)],
        cache,
        longest,
        device,
    )
    logits = out.logits[:, -1, :]
    if len(plans) < len(chunk):  # identical sequences (a GRPO group): one row each again
        index = torch.tensor(row_of, device=device)
        logits = logits.index_select(0, index)
        for layer in cache.layers:
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)
    return cache, [pads[i] for i in row_of], longest, logits, int(forwarded)


def seed_cache(cache: Any, plans: list[Plan], pads: list[int], past: int) -> None:
    """Fill `cache` with the first `past` (left-padded) positions of every row."""
    kv = next(entry.kv for _, _, _, entry in plans if entry is not None)
    for layer, (k0, v0) in enumerate(kv):
        keys = k0.new_zeros(len(plans), k0.shape[0], past, k0.shape[2])
        values = v0.new_zeros(len(plans), v0.shape[0], past, v0.shape[2])
        for row, ((_, _, _, entry), pad) in enumerate(zip(plans, pads, strict=True)):
            take = past - pad  # <= the row's reused length, by the choice of `past`
            if take > 0 and entry is not None:
                keys[row, :, pad:] = entry.kv[layer][0][:, :take]
                values[row, :, pad:] = entry.kv[layer][1][:, :take]
        cache.update(keys, values, layer)


def remember(
    prefix: PrefixCache,
    rows: list[tuple[list[int], int, int]],
    cache: Any,
    end: int,
    device: torch.device,
) -> None:
    """Offer rows' keys/values to the prefix cache: for each ``(tokens, row, start)``,
    positions ``start:end`` of batch row `row` hold `tokens`.

    The wanted blocks of all rows are gathered by one indexing kernel per layer and
    tensor (not two copies per layer per row: on a GPU, 128 rows finishing together
    cost 6,144 kernel launches that way); each entry keeps a view of its own tokens, and
    the gathered storage counts in full against the prefix cache's budget until its
    last entry is evicted. Rows past that budget are not gathered (the last ones are
    kept, as inserting them one by one would)."""
    if not prefix.max_tokens:
        return
    wanted = []
    total = 0
    for tokens, row, start in reversed(rows):
        if len(tokens) == end - start and (n := prefix.wanted(tokens)):
            if total + n > prefix.max_tokens:
                break
            wanted.append((tokens, row, start, n))
            total += n
    if not wanted:
        return
    wanted.reverse()
    row_index = torch.tensor([row for _, row, _, n in wanted for _ in range(n)], device=device)
    col_index = torch.tensor(
        [start + j for _, _, start, n in wanted for j in range(n)], device=device
    )
    # [tokens of all entries, kv_heads, head_dim] per layer
    keys = [ly.keys[row_index, :, col_index] for ly in cache.layers]
    values = [ly.values[row_index, :, col_index] for ly in cache.layers]
    shared = Shared(total)
    offset = 0
    for tokens, _, _, n in wanted:
        part = slice(offset, offset + n)
        kv = [
            (k[part].transpose(0, 1), v[part].transpose(0, 1))
            for k, v in zip(keys, values, strict=True)
        ]
        prefix.insert(tokens[:n], kv, shared=shared)
        offset += n


def attention_mask(pads: list[int], length: int, device: torch.device) -> torch.Tensor:
    """``[rows, length]``: 1 from each row's first real token on."""
    columns = torch.arange(length, device=device).unsqueeze(0)
    return (columns >= torch.tensor(pads, device=device).unsqueeze(-1)).long()
