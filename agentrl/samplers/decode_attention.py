"""Attention for one-token decode steps on CPU, registered with transformers.

PyTorch's CPU ``scaled_dot_product_attention`` (the flash kernel) is slow for a single
query position, several times slower than two plain matmuls and a softmax at small-model
shapes, and it runs once per layer per decode step. :func:`decode_attention` does the
plain version for ``q_len == 1`` (the query heads that share a key/value head are batched
into one matmul, no ``repeat_kv``) and hands everything else (prefill, sliding windows,
soft-capping, dropout) to transformers' own SDPA path unchanged.

:func:`use_decode_attention` registers it (with SDPA's mask preparation) as
``"agentrl_decode"`` and switches a model to it; the hf sampler does that for models that
run SDPA on a CPU.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger(__name__)

NAME = "agentrl_decode"


def decode_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention-function signature: ``query [B, H, q, D]``, ``key`` /
    ``value [B, KV, L, D]`` -> ``([B, q, H, D], None)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    plain = (
        q_len == 1
        and dropout == 0.0
        and heads % kv_heads == 0
        and not kwargs.get("sliding_window")
        and getattr(module, "attn_logit_softcapping", None) is None
        and kwargs.get("position_bias") is None
    )
    if not plain:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scale = scaling if scaling is not None else dim**-0.5
    group = heads // kv_heads
    length = key.shape[-2]
    # keys may be a view into a longer buffer (agentrl.samplers.kv_cache); [B*KV, L, D] @
    # [B*KV, D, group] reads them in place, where the usual q @ k^T copied them first (5x
    # slower at 550 positions)
    keys = key.reshape(b * kv_heads, length, dim)
    q = query.reshape(b * kv_heads, group, dim)
    scores = torch.bmm(keys, q.transpose(1, 2)).view(b, kv_heads, length, group)
    scores = scores.transpose(-1, -2).float().mul_(scale)  # [B, KV, group, L]
    if attention_mask is not None:
        mask = attention_mask[:, :, -1:, -length:]  # [B or 1, 1, 1, L]
        if mask.dtype == torch.bool:
            scores.masked_fill_(~mask, float("-inf"))
        else:
            scores.add_(mask.float())
    probs = torch.softmax(scores, dim=-1).to(value.dtype).reshape(b * kv_heads, group, length)
    out = torch.bmm(probs, value.reshape(b * kv_heads, length, dim))  # [B*KV, group, D]
    return out.view(b, 1, heads, dim), None


def use_decode_attention(model: Any) -> bool:
    """Switch `model` (running SDPA) to :func:`decode_attention`; returns whether it did."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    AttentionInterface.register(NAME, decode_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    try:
        model.set_attn_implementation(NAME)
    except Exception as e:  # an architecture that refuses custom attention: keep SDPA
        log.info("decode attention not applied (%s: %s); keeping SDPA", type(e).__name__, e)
        return False
    return True
