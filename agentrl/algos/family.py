"""More of the policy-optimisation family, each a small registered function.

* ``reinforce_mean`` -- REINFORCE with a batch-mean baseline (Williams 1992).
* ``lite_ppo``       -- Lite PPO's normalisation: group mean, batch std (Liu et al. 2025).
* ``gmpo``           -- geometric mean of token ratios, clipped per token in log space
  (Zhao et al. 2025).
* ``gvpo``           -- group-centred reward regressed on the group-centred implicit reward
  beta * log(pi_theta / pi_ref) (Zhang et al. 2025); reads ``ref_logprobs``, ``group_ids``
  and ``rewards`` and couples a group's rows.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from agentrl.algos.advantages import _check_rows, _clean, _out, group_stats
from agentrl.algos.registry import register_advantage, register_policy_loss
from agentrl.algos.stats import LOG_RATIO_CLAMP as _LOG_RATIO_CLAMP
from agentrl.algos.stats import masked_mean


# REINFORCE with a mean baseline (Williams 1992, sec. 4): A_i = r_i - mean_batch(r)
@register_advantage("reinforce_mean")
def reinforce_mean(
    rewards: Tensor, group_ids: Tensor | None = None, *, valid: Tensor | None = None
) -> Tensor:
    v = _check_rows(rewards, group_ids, valid)
    r = _clean(rewards, v)
    n = v.sum()
    if n < 1:
        return _out(torch.zeros_like(r), rewards)
    adv = r - (r * v).sum() / n
    return _out(torch.where(v > 0, adv, torch.zeros_like(adv)), rewards)


# Lite PPO (Liu et al. 2025, "Tricks or Traps?", sec. 4.1): A_i = (r_i - mean_group(r)) / std_batch(r)
@register_advantage("lite_ppo")
def lite_ppo(
    rewards: Tensor, group_ids: Tensor, *, valid: Tensor | None = None, eps: float = 1e-6
) -> Tensor:
    v = _check_rows(rewards, group_ids, valid)
    count, _, mean, _ = group_stats(rewards, group_ids, v)
    r = _clean(rewards, v)
    n = v.sum()
    if n < 2:
        return _out(torch.zeros_like(r), rewards)
    batch_mean = (r * v).sum() / n
    batch_std = ((((r - batch_mean) ** 2) * v).sum() / (n - 1)).sqrt()
    adv = (r - mean) / (batch_std + eps)
    return _out(torch.where((count > 1) & (v > 0), adv, torch.zeros_like(adv)), rewards)


# GMPO (Zhao et al. 2025, eq. 4): maximise sgn(A) * (prod_t |min(rho_t A, clip(rho_t, e^-eps,
# e^eps) A)|)^(1/|o|) = A * exp(mean_t l_t), l_t = log rho_t clipped on A's side, one value
# per sequence (use agg=seq-mean-token-mean, as the paper does). The paper's eps is
# `log_clip`: an option named `eps` would also reach the advantage estimators that take one
# (grpo's std epsilon), as algorithm.options go to both
@register_policy_loss("gmpo")
def gmpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    log_clip: float = 0.4,
) -> tuple[Tensor, dict[str, Any]]:
    if log_clip <= 0:
        raise ValueError(f"gmpo log_clip must be > 0 (got {log_clip})")
    m = mask.to(logprobs.dtype)
    lengths = m.sum(dim=-1).clamp(min=1.0)
    adv = (advantages * m).sum(dim=-1) / lengths  # the sequence's advantage
    log_ratio = (logprobs - old_logprobs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    clipped = log_ratio.clamp(-log_clip, log_clip)
    sign = torch.sign(adv)[:, None]
    # pessimistic side: min(log rho, clip) for A > 0, max for A < 0
    l_tok = torch.where(
        sign >= 0, torch.minimum(log_ratio, clipped), torch.maximum(log_ratio, clipped)
    )
    seq_ratio = torch.exp((l_tok * m).sum(dim=-1) / lengths)
    seq_loss = -adv * seq_ratio
    has = mask.sum(dim=-1) > 0
    metrics = {
        "clip_frac": masked_mean(l_tok != log_ratio, mask),
        "ratio_mean": masked_mean(seq_ratio, has),
    }
    return seq_loss[:, None].expand_as(logprobs), metrics


# GVPO (Zhang et al. 2025, eq. 9): L = 1/2 sum_i [(R_i - mean_g R) - beta * (s_i - mean_g s)]^2,
# s_i = sum_t log pi_theta(y_t) - log pi_ref(y_t), one value per sequence; no ratio, no advantages
@register_policy_loss("gvpo", couples_group=True, inputs=("ref_logprobs", "group_ids", "rewards"))
def gvpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    ref_logprobs: Tensor,
    group_ids: Tensor,
    rewards: Tensor,
    beta: float = 0.1,
) -> tuple[Tensor, dict[str, Any]]:
    if beta <= 0:
        raise ValueError(f"gvpo beta must be > 0 (got {beta})")
    m = mask.to(logprobs.dtype)
    s = ((logprobs - ref_logprobs.detach()) * m).sum(dim=-1)
    _, groups = torch.unique(group_ids, return_inverse=True)
    n = int(groups.max()) + 1 if groups.numel() else 0
    count = torch.zeros(n, dtype=s.dtype, device=s.device).index_add_(0, groups, torch.ones_like(s))
    s_mean = torch.zeros_like(count).index_add_(0, groups, s) / count
    r = rewards.to(s.dtype)
    r_mean = torch.zeros_like(count).index_add_(0, groups, r) / count
    resid = (r - r_mean[groups]) - beta * (s - s_mean[groups])
    seq_loss = 0.5 * resid**2  # one value per sequence: use agg=seq-mean-token-mean
    metrics = {"gvpo_residual": masked_mean(resid.abs(), mask.sum(dim=-1) > 0)}
    return seq_loss[:, None].expand_as(logprobs), metrics


# PPO with an adaptive KL penalty instead of the clip (Schulman et al. 2017, eq. 8):
# L_t = -r_t A_t + beta * KL_t, KL_t = r_t - 1 - log r_t (k3 of KL(pi_old || pi_theta) on
# tokens from pi_old). The learner adapts beta between steps (:class:`AdaptiveKL`).
@register_policy_loss("ppo_adaptive_kl")
def ppo_adaptive_kl_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    kl_beta: float = 1.0,
    kl_target: float = 0.01,
) -> tuple[Tensor, dict[str, Any]]:
    if kl_beta < 0 or kl_target <= 0:
        raise ValueError(f"need kl_beta >= 0 and kl_target > 0 (got {kl_beta}, {kl_target})")
    log_ratio = (logprobs - old_logprobs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    kl = ratio - 1.0 - log_ratio
    loss = -advantages * ratio + kl_beta * kl
    return loss, {"kl_old_theta": masked_mean(kl.detach(), mask), "kl_beta": kl_beta}


class AdaptiveKL:
    """Schulman et al. 2017, sec. 4: after a step with mean KL d, beta /= 2 when
    d < target / 1.5 and beta *= 2 when d > 1.5 * target."""

    def __init__(self, beta: float, target: float) -> None:
        self.beta = float(beta)
        self.target = float(target)

    def update(self, kl: float) -> float:
        if kl < self.target / 1.5:
            self.beta /= 2.0
        elif kl > self.target * 1.5:
            self.beta *= 2.0
        return self.beta
