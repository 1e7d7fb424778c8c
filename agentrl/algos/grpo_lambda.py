"""GRPO-lambda: a length penalty only for the most accurate groups (Dai et al. 2025).

Per batch, the top ``top_fraction`` of groups by accuracy (mean reward of their valid
rows) have their rewards shaped by a Kimi-1.5-style length score,

    lambda_i = 0.5 - (L_i - L_min) / (L_max - L_min)   (over the group's valid rows),
    r_i' = r_i + length_coef * (lambda_i if r_i >= success else min(0, lambda_i)),

and every group is then normalised as GRPO does. Groups outside the top fraction keep their
plain rewards, so length pressure only acts where the task is already solved.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from agentrl.algos.advantages import _check_rows, _clean, _group_index, grpo
from agentrl.algos.registry import register_advantage


# GRPO-lambda (Dai et al. 2025, arXiv 2505.18086, sec. 3): length reward for the top-lambda groups
@register_advantage("grpo_lambda", inputs=("response_lengths",))
def grpo_lambda(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    valid: Tensor | None = None,
    response_lengths: Tensor,
    top_fraction: float = 0.2,
    length_coef: float = 1.0,
    success: float = 1.0,
    eps: float = 1e-6,
) -> Tensor:
    if not 0.0 <= top_fraction <= 1.0:
        raise ValueError(f"top_fraction must be in [0, 1] (got {top_fraction})")
    v = _check_rows(rewards, group_ids, valid)
    r = _clean(rewards, v)
    inverse, n_groups = _group_index(group_ids)
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inverse, v)
    accuracy = torch.zeros_like(count).index_add_(0, inverse, (r >= success).double() * v)
    accuracy = accuracy / count.clamp(min=1.0)
    present = count > 0
    n_top = math.ceil(top_fraction * int(present.sum()))
    top = torch.zeros(n_groups, dtype=torch.bool)
    if n_top > 0:
        ranked = torch.where(present, accuracy, torch.full_like(accuracy, -1.0))
        top[torch.argsort(ranked, descending=True, stable=True)[:n_top]] = True
    L = response_lengths.to(torch.float64)
    big = float("inf")
    lo = torch.full((n_groups,), big, dtype=torch.float64).scatter_reduce(
        0, inverse, torch.where(v > 0, L, torch.full_like(L, big)), reduce="amin"
    )
    hi = torch.full((n_groups,), -big, dtype=torch.float64).scatter_reduce(
        0, inverse, torch.where(v > 0, L, torch.full_like(L, -big)), reduce="amax"
    )
    span = (hi - lo)[inverse]
    lam = torch.where(
        span > 0, 0.5 - (L - lo[inverse]) / span.clamp(min=1e-12), torch.zeros_like(L)
    )
    bonus = torch.where(r >= success, lam, lam.clamp(max=0.0))
    shaped = r + length_coef * bonus * top[inverse].double() * v
    return grpo(
        shaped.to(rewards.dtype if rewards.is_floating_point() else torch.float32),
        group_ids,
        valid=valid,
        eps=eps,
    )
