"""Loss aggregation: how a per-token loss ``[B, T]`` becomes one scalar.

``denominator`` (optional) replaces the local count -- tokens for ``token-mean``,
sequences for the ``seq-mean-*`` modes -- so a learner that splits a batch into
micro-batches can divide by the whole batch's count and sum the micro-batch losses.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from agentrl.algos.registry import AGGREGATIONS, register_aggregation


def _count(mask: Tensor, denominator: float | None, what: Tensor) -> Tensor | float:
    if denominator is not None:
        if denominator <= 0:
            raise ValueError(f"denominator must be > 0 (got {denominator})")
        return float(denominator)  # a host scalar: no copy to (and wait on) the device
    return what.clamp(min=1.0)


# DAPO (Yu et al. 2025, eq. 12): 1/sum_i |o_i| * sum_i sum_t l_{i,t}
@register_aggregation("token-mean", unit="token")
def token_mean(loss: Tensor, mask: Tensor, *, denominator: float | None = None, **_: Any) -> Tensor:
    m = mask.to(loss.dtype)
    return (loss * m).sum() / _count(m, denominator, m.sum())


# GRPO (Shao et al. 2024, eq. 3): 1/G sum_i 1/|o_i| sum_t l_{i,t}; rows without tokens are skipped
@register_aggregation("seq-mean-token-mean")
def seq_mean_token_mean(
    loss: Tensor, mask: Tensor, *, denominator: float | None = None, **_: Any
) -> Tensor:
    m = mask.to(loss.dtype)
    lengths = m.sum(dim=-1)
    per_seq = (loss * m).sum(dim=-1) / lengths.clamp(min=1.0)
    return per_seq.sum() / _count(m, denominator, (lengths > 0).to(loss.dtype).sum())


# Dr. GRPO (Liu et al. 2025, eq. 3): 1/G sum_i 1/L sum_t l_{i,t}, L a constant (default: T)
@register_aggregation("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(
    loss: Tensor,
    mask: Tensor,
    *,
    norm_length: int | None = None,
    denominator: float | None = None,
    **_: Any,
) -> Tensor:
    m = mask.to(loss.dtype)
    L = float(norm_length) if norm_length is not None else float(mask.shape[-1])
    if L <= 0:
        raise ValueError(f"norm_length must be > 0 (got {norm_length})")
    per_seq = (loss * m).sum(dim=-1) / L
    return per_seq.sum() / _count(m, denominator, (m.sum(dim=-1) > 0).to(loss.dtype).sum())


def aggregate(
    name: str,
    loss: Tensor,
    mask: Tensor,
    *,
    norm_length: int | None = None,
    denominator: float | None = None,
) -> Tensor:
    """Reduce a per-token ``loss [B, T]`` over ``mask`` with the mode registered as ``name``."""
    if loss.shape != mask.shape:
        raise ValueError(
            f"loss and mask must have the same shape (got {tuple(loss.shape)} and {tuple(mask.shape)})"
        )
    return AGGREGATIONS.get(name)(loss, mask, norm_length=norm_length, denominator=denominator)
