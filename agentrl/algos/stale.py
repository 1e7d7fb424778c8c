"""Policy losses built for stale or off-policy data, each a small registered function.

* ``cispo``   -- clipped, stop-gradient IS weight times every token's log-prob (MiniMax-M1,
  arXiv 2506.13585, eq. 4): no token leaves the gradient.
* ``sapo``    -- a soft sigmoid gate on the ratio instead of the hard clip, one temperature
  for positive and one for negative advantages (Qwen, arXiv 2511.20347).
* ``m2po``    -- the tokens with the largest (log ratio)^2 are masked until the second
  moment of the rest is at most ``m2_threshold``; no clip (arXiv 2510.01161).
* ``dppo_kl`` -- prime-rl's default loss: a binary trust-region mask on the probability
  difference, conditioned on the advantage's sign, plus a squared-log-ratio penalty.

Each returns a per-token loss ``[B, T]``; :func:`agentrl.algos.policy_loss` aggregates it
(the papers average over all tokens: ``agg: token-mean``, the default).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from agentrl.algos.registry import register_policy_loss
from agentrl.algos.stats import LOG_RATIO_CLAMP as _LOG_RATIO_CLAMP
from agentrl.algos.stats import masked_max, masked_mean


def _log_ratio(logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    return (logprobs - old_logprobs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)


# CISPO (MiniMax-M1, Chen et al. 2025, arXiv 2506.13585, eq. 4):
# L_t = -sg(clip(r_t, 1 - eps_low_is, 1 + eps_high)) * A_t * log pi_theta(y_t),
# r_t = pi_theta / pi_old. The paper sets no lower bound (eps_low_is = None) and tunes eps_high.
@register_policy_loss("cispo")
def cispo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_high: float = 0.28,
    eps_low_is: float | None = None,
) -> tuple[Tensor, dict[str, Any]]:
    if eps_high < 0:
        raise ValueError(f"cispo eps_high must be >= 0 (got {eps_high})")
    if eps_low_is is not None and not 0 <= eps_low_is <= 1:
        raise ValueError(f"cispo eps_low_is must be in [0, 1] or None (got {eps_low_is})")
    ratio = torch.exp(_log_ratio(logprobs, old_logprobs)).detach()
    low = None if eps_low_is is None else 1.0 - eps_low_is
    weight = ratio.clamp(min=low, max=1.0 + eps_high)
    loss = -weight * advantages * logprobs
    metrics = {
        "clip_frac": masked_mean(weight != ratio, mask),
        "is_weight_mean": masked_mean(weight, mask),
        "ratio_mean": masked_mean(ratio, mask),
        "ratio_max": masked_max(ratio, mask),
    }
    return loss, metrics


# SAPO (Gao et al. 2025, arXiv 2511.20347): maximise f(r_t) A_t with the soft gate
# f(r) = 4 / tau * sigmoid(tau * (r - 1)), tau = tau_pos where A > 0 else tau_neg. Its
# gradient weight 4 sigmoid(x)(1 - sigmoid(x)) is 1 on-policy (r = 1) and decays smoothly
# as r leaves 1; a larger tau_neg damps negative updates faster (the paper: 1.0 / 1.05).
@register_policy_loss("sapo")
def sapo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> tuple[Tensor, dict[str, Any]]:
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"sapo needs tau_pos > 0 and tau_neg > 0 (got {tau_pos}, {tau_neg})")
    ratio = torch.exp(_log_ratio(logprobs, old_logprobs))
    tau = torch.where(advantages > 0, ratio.new_tensor(tau_pos), ratio.new_tensor(tau_neg))
    x = tau * (ratio - 1.0)
    gate = 4.0 / tau * torch.sigmoid(x)
    loss = -gate * advantages
    s = torch.sigmoid(x.detach())
    metrics = {
        # the factor the gate puts on the plain policy gradient r * A * grad log pi
        "gate_weight_mean": masked_mean(4.0 * s * (1.0 - s), mask),
        "ratio_mean": masked_mean(ratio, mask),
        "ratio_max": masked_max(ratio, mask),
    }
    return loss, metrics


def m2_keep_mask(log_ratio: Tensor, mask: Tensor, threshold: float) -> Tensor:
    """1 on the tokens M2PO keeps: the fewest tokens with the largest (log r)^2 are dropped
    so that the mean (log r)^2 of the kept tokens is at most `threshold`."""
    sel = mask > 0
    sq = (log_ratio.detach().float() ** 2) * sel
    n = int(sel.sum())
    keep = sel.clone()
    if n == 0 or float(sq.sum()) <= threshold * n:
        return keep
    values, order = torch.sort(sq.flatten(), descending=True)
    values = values[:n]  # the masked-out zeros sort last
    # dropping the k largest leaves sum(values[k:]) over n - k tokens
    rest = values.sum() - torch.cat([values.new_zeros(1), values.cumsum(0)[:-1]])
    counts = torch.arange(n, 0, -1, device=values.device, dtype=values.dtype)
    ok = (rest / counts) <= threshold
    k = int(torch.nonzero(ok)[0]) if bool(ok.any()) else n
    flat = keep.flatten().clone()
    flat[order[:k]] = False
    return flat.view_as(keep)


# M2PO (Zheng et al. 2025, arXiv 2510.01161): M2 = mean_t (log r_t)^2 over the batch's
# tokens; while M2 > tau, mask the token with the largest (log r_t)^2. Then
# L_t = -M_t * r_t * A_t, no clip. "The batch" is what the loss is called on (a micro-batch).
@register_policy_loss("m2po")
def m2po_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    m2_threshold: float = 0.04,
) -> tuple[Tensor, dict[str, Any]]:
    if m2_threshold < 0:
        raise ValueError(f"m2po m2_threshold must be >= 0 (got {m2_threshold})")
    log_ratio = _log_ratio(logprobs, old_logprobs)
    keep = m2_keep_mask(log_ratio, mask, m2_threshold)
    ratio = torch.exp(log_ratio)
    loss = -keep.to(ratio.dtype) * ratio * advantages
    sq = log_ratio.detach() ** 2
    metrics = {
        "m2": masked_mean(sq, mask),
        "m2_kept": masked_mean(sq, keep),
        "masked_frac": masked_mean(~keep, mask),
        "ratio_mean": masked_mean(ratio, mask),
        "ratio_max": masked_max(ratio, mask),
    }
    return loss, metrics


# prime-rl's default loss: src/prime_rl/trainer/rl/loss.py, default_loss_fn, at commit
# e48a53853ef82dc4549645685cd0065b875f05fa (DPPO-Binary TV, arXiv 2602.04879, plus the
# Kimi-K2.5 KL term, arXiv 2602.02276). With d_t = pi_theta(y_t) - pi_old(y_t) (probabilities):
# a token is dropped from the policy term when A_t > 0 and d_t > mask_high, or A_t <= 0 and
# d_t < -mask_low; L_t = -keep_t * adv_tau * A_t * r_t + kl_tau * (log r_t)^2 on every token.
@register_policy_loss("dppo_kl")
def dppo_kl_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    dppo_mask_low: float = 0.2,
    dppo_mask_high: float = 0.2,
    adv_tau: float = 1.0,
    kl_tau: float = 1e-3,
) -> tuple[Tensor, dict[str, Any]]:
    if min(dppo_mask_low, dppo_mask_high, adv_tau, kl_tau) < 0:
        raise ValueError(
            "dppo_kl needs dppo_mask_low, dppo_mask_high, adv_tau and kl_tau >= 0 (got "
            f"{dppo_mask_low}, {dppo_mask_high}, {adv_tau}, {kl_tau})"
        )
    log_ratio = _log_ratio(logprobs, old_logprobs)
    ratio = torch.exp(log_ratio)
    diff = (torch.exp(logprobs) - torch.exp(old_logprobs)).detach()
    positive = advantages > 0
    dropped = torch.where(positive, diff > dppo_mask_high, diff < -dppo_mask_low)
    keep = (~dropped).to(ratio.dtype)
    loss = -keep * adv_tau * advantages * ratio + kl_tau * log_ratio**2
    metrics = {
        "masked_frac": masked_mean(dropped, mask),
        "masked_frac_high": masked_mean(dropped & positive, mask),
        "masked_frac_low": masked_mean(dropped & (advantages < 0), mask),
        "ratio_mean": masked_mean(ratio, mask),
    }
    return loss, metrics
