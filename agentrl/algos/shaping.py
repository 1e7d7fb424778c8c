"""Reward and loss-mask shaping: DAPO's overlong penalty and filter, REINFORCE++'s KL-in-reward."""

from __future__ import annotations

import torch
from torch import Tensor


# DAPO soft overlong punishment (Yu et al. 2025, eq. 13):
# R(y) = 0 if |y| <= L_max - L_cache; ((L_max - L_cache) - |y|) / L_cache if |y| <= L_max; -1 beyond
def overlong_penalty(lengths: Tensor, max_len: int, cache_len: int) -> Tensor:
    """Length penalty ``[B]`` in [-1, 0] to add to the rewards (``cache_len=0``: a hard step)."""
    if max_len <= 0 or cache_len < 0 or cache_len > max_len:
        raise ValueError(
            f"need max_len > 0 and 0 <= cache_len <= max_len (got max_len={max_len}, "
            f"cache_len={cache_len})"
        )
    length = torch.as_tensor(lengths).to(torch.float32)
    start = float(max_len - cache_len)
    if cache_len == 0:
        return torch.where(length > max_len, -torch.ones_like(length), torch.zeros_like(length))
    soft = (start - length) / float(cache_len)
    out = torch.where(length <= start, torch.zeros_like(length), soft)
    return torch.where(length > max_len, -torch.ones_like(length), out)


# DAPO overlong filtering (Yu et al. 2025, sec. 3.4): truncated samples are masked out of
# the loss, so a cut-off answer's reward (right or wrong) teaches nothing.
def overlong_filter(loss_mask: Tensor, truncated: Tensor) -> Tensor:
    """``loss_mask`` ``[B, T]`` with the rows where ``truncated`` ``[B]`` is set zeroed."""
    if truncated.shape != loss_mask.shape[:1]:
        raise ValueError(
            f"truncated must be [B] = {tuple(loss_mask.shape[:1])} (got {tuple(truncated.shape)})"
        )
    keep = (~truncated.to(torch.bool)).to(loss_mask.dtype)
    return loss_mask * keep[:, None]


# REINFORCE++ (Hu 2025, eq. 5): r_t = 1[t = last] * r(x, y) - beta * KL_t, with
# KL_t an estimate of KL(pi_old || pi_ref) at token t (k1: log pi_old - log pi_ref).
def kl_penalized_rewards(rewards: Tensor, kl: Tensor, mask: Tensor, kl_coef: float) -> Tensor:
    """Per-token rewards ``[B, T]``: the outcome ``rewards`` ``[B]`` on each row's last
    trained token minus ``kl_coef * kl`` on every trained token (``kl`` detached)."""
    if kl.shape != mask.shape or rewards.shape != mask.shape[:1]:
        raise ValueError(
            "kl and mask must be [B, T] and rewards [B] (got "
            f"{tuple(kl.shape)}, {tuple(mask.shape)}, {tuple(rewards.shape)})"
        )
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0 (got {kl_coef})")
    m = mask.to(torch.float32)
    T = m.shape[1]
    pos = torch.arange(T, device=m.device).expand_as(m)
    last = torch.where(m > 0, pos, torch.full_like(pos, -1)).max(dim=1).values
    outcome = (pos == last[:, None]) & (last[:, None] >= 0)
    token_rewards = torch.where(outcome, rewards.to(torch.float32)[:, None], torch.zeros_like(m))
    return token_rewards - kl_coef * kl.detach().to(torch.float32) * m
