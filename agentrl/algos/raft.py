"""Rejection-sampling fine-tuning from the run's own rollouts: RAFT and RAFT++.

* ``advantage: raft`` keeps, in every group, the samples with the group's best reward
  (above ``min_reward``) with advantage 1 and rejects the rest: rejected rows leave the
  loss mask (``selects_rows``), so the loss averages over the kept samples' tokens only.
* ``policy_loss: reinforce`` is ``-A log pi_theta``: with RAFT's advantages, the SFT
  negative log-likelihood of the kept samples (RAFT, Dong et al. 2023, arXiv 2304.06767).
* RAFT++ (Xiong et al. 2025, arXiv 2504.11343): the same kept samples through the
  clipped importance-weighted loss, ``advantage: raft`` with ``policy_loss: ppo``:
  L_t = -min(r_t, clip(r_t, 1 - eps_low, 1 + eps_high)), r_t = pi_theta / pi_behaviour.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from agentrl.algos.advantages import _check_rows, _clean, _group_index, _out
from agentrl.algos.registry import register_advantage, register_policy_loss
from agentrl.algos.stats import masked_mean


# RAFT (Dong et al. 2023, Alg. 1): per prompt, keep the best of the K samples (ties: all of
# them); with 0/1 rewards that is every correct sample (Xiong et al. 2025). A group whose
# best reward is <= min_reward (an all-fail group) keeps nothing.
@register_advantage("raft", selects_rows=True)
def raft(
    rewards: Tensor, group_ids: Tensor, *, valid: Tensor | None = None, min_reward: float = 0.0
) -> Tensor:
    v = _check_rows(rewards, group_ids, valid)
    r = _clean(rewards, v).to(torch.float64)
    inverse, n_groups = _group_index(group_ids)
    low = torch.finfo(torch.float64).min
    best = torch.full((n_groups,), low, dtype=r.dtype, device=r.device).scatter_reduce(
        0, inverse, torch.where(v > 0, r, torch.full_like(r, low)), reduce="amax"
    )[inverse]
    kept = (v > 0) & (r == best) & (r > min_reward)
    return _out(kept.to(torch.float64), rewards)


# REINFORCE's loss (Williams 1992): L_t = -A_t log pi_theta(y_t), no ratio and no clip; with
# RAFT's 0/1 advantages, the negative log-likelihood of the kept samples
@register_policy_loss("reinforce")
def reinforce_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, dict[str, Any]]:
    nll = -logprobs
    return advantages * nll, {"nll": masked_mean(nll, (mask > 0) & (advantages != 0))}
