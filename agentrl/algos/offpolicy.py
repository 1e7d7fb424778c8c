"""Off-policy corrections: importance weights, rejection masks, approximate proximal log-probs.

Every function here is detached tensor math over ``[B, T]`` per-token log-probs:
``old_logprobs`` (pi_old: the learner's recomputed or proximal policy), ``behavior_logprobs``
(pi_behave: the sampler's) and ``mask`` (the tokens that are trained). The learner
multiplies each token's policy loss by ``importance_weights(...) * rejection_mask(...)``.

    w = importance_weights(old, behave, mask, cap=2.0, mode="truncate", level="token")
    keep = rejection_mask("token", old, behave, mask, low=0.5, high=5.0)       # IcePop
    prox = loglinear_proximal_logprobs(behave, logprobs, versions, version=7)  # AReaL

Where two names compute the same thing (see docs/off_policy.md): ``mode="mask"`` with cap
``c`` is ``rejection_mask("token", low=0, high=c)`` applied to the weights of
``mode="truncate"`` with the same cap.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from agentrl.algos.registry import OFF_POLICY_MASKS, register_off_policy_mask
from agentrl.algos.stats import LOG_RATIO_CLAMP as _LOG_RATIO_CLAMP
from agentrl.algos.stats import masked_max, masked_mean

IS_MODES = ("truncate", "mask")
IS_LEVELS = ("token", "sequence")


def _log_ratio(old_logprobs: Tensor, behavior_logprobs: Tensor) -> Tensor:
    """log(pi_old / pi_behave), detached and clamped so exp() stays finite."""
    return (old_logprobs - behavior_logprobs).detach().clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)


def _seq_log_ratio(log_w: Tensor, mask: Tensor, *, mean: bool) -> Tensor:
    """Per-row sum (or mean) of the token log-ratios over the trained tokens -> ``[B]``."""
    m = mask.to(log_w.dtype)
    total = (log_w * m).sum(dim=-1)
    return total / m.sum(dim=-1).clamp(min=1.0) if mean else total


# Truncated IS (Yao et al. 2025; Espeholt et al. 2018, eq. 1 with rho-bar = cap):
# w_t = min(pi_old(y_t) / pi_behave(y_t), C); sequence level: w = min(prod_t w_t, C)
def importance_weights(
    old_logprobs: Tensor,
    behavior_logprobs: Tensor,
    mask: Tensor | None = None,
    *,
    cap: float = 2.0,
    mode: str = "truncate",
    level: str = "token",
) -> Tensor:
    """Detached weights ``[B, T]`` pi_old / pi_behave, per token or one per sequence.

    ``mode="truncate"`` caps the weight at ``cap``; ``mode="mask"`` zeroes it above the
    cap (AReaL's behaviour-importance mask). ``level="sequence"`` gives every token of a
    row the row's product of token ratios over ``mask`` (needed for that level).
    """
    if cap <= 0:
        raise ValueError(f"is_cap must be > 0 (got {cap})")
    if mode not in IS_MODES:
        raise ValueError(f"is_mode must be one of {IS_MODES} (got {mode!r})")
    if level not in IS_LEVELS:
        raise ValueError(f"is_level must be one of {IS_LEVELS} (got {level!r})")
    log_w = _log_ratio(old_logprobs, behavior_logprobs)
    if level == "sequence":
        if mask is None:
            raise ValueError("is_level='sequence' needs mask= (the trained tokens of each row)")
        seq = _seq_log_ratio(log_w, mask, mean=False).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        log_w = seq[:, None].expand_as(log_w)
    w = torch.exp(log_w)
    if mode == "truncate":
        return w.clamp(max=cap)
    return torch.where(w <= cap, w, torch.zeros_like(w))


def _check_bounds(low: float, high: float) -> None:
    if not 0.0 <= low < high:
        raise ValueError(f"rejection bounds need 0 <= low < high (got low={low}, high={high})")


# IcePop (Ling team 2025, "Ring-1T", eq. 4): M(k) = k if low <= k <= high else 0 -- the
# token's ratio k = pi_old / pi_behave outside [low, high] takes the token out of the loss.
@register_off_policy_mask("token")
def token_rejection(log_ratio: Tensor, mask: Tensor, *, low: float, high: float) -> Tensor:
    """1 for tokens whose ratio lies in [low, high], else 0 -> ``[B, T]``."""
    _check_bounds(low, high)
    ratio = torch.exp(log_ratio)
    return ((ratio >= low) & (ratio <= high)).to(log_ratio.dtype)


# Geometric-mean sequence mask (verl's rollout rejection sampling, "geometric" level):
# rho_i = exp(mean_t log(pi_old / pi_behave)); the whole sequence is dropped outside [low, high].
@register_off_policy_mask("geometric")
def geometric_rejection(log_ratio: Tensor, mask: Tensor, *, low: float, high: float) -> Tensor:
    """1 on every token of rows whose geometric-mean ratio lies in [low, high] -> ``[B, T]``."""
    _check_bounds(low, high)
    rho = torch.exp(_seq_log_ratio(log_ratio, mask, mean=True))
    keep = (rho >= low) & (rho <= high)
    return keep[:, None].expand_as(log_ratio).to(log_ratio.dtype)


def rejection_mask(
    name: str,
    old_logprobs: Tensor,
    behavior_logprobs: Tensor,
    mask: Tensor,
    *,
    low: float,
    high: float,
) -> Tensor:
    """The rejection mask registered as ``name`` (``token``, ``geometric`` or your own):
    ``[B, T]`` with 1 where the token stays in the loss and 0 where it is dropped."""
    fn = OFF_POLICY_MASKS.get(name)
    return fn(_log_ratio(old_logprobs, behavior_logprobs), mask, low=low, high=high)


# AReaL's proximal approximation (docs/algorithms/prox_approx.md): with versions v,
# alpha = (v_prox - v_behave) / (v_theta - v_behave),
# log pi_prox ~= log pi_behave + alpha * (log pi_theta - log pi_behave)
def loglinear_proximal_logprobs(
    behavior_logprobs: Tensor,
    logprobs: Tensor,
    versions: Tensor,
    version: int,
    theta_version: float | None = None,
) -> Tensor:
    """Detached approximate log-probs ``[B, T]`` of the proximal policy (weights ``version``,
    the ones the step started from) without a forward pass of it.

    ``logprobs`` are the current policy's, whose version is ``theta_version`` (default
    ``version + 1``, as AReaL; the learner passes ``version + k / n`` after k of the step's
    n optimizer updates). Where ``theta_version == version`` the current policy *is* the
    proximal one and its log-probs are returned; tokens with ``versions < 0`` (not
    generated) keep ``behavior_logprobs``.
    """
    if theta_version is None:
        theta_version = version + 1.0
    if theta_version < version:
        raise ValueError(
            f"theta_version must be >= version (got theta_version={theta_version}, "
            f"version={version})"
        )
    v_behave = versions.to(torch.float64)
    gap = float(version) - v_behave
    span = float(theta_version) - v_behave
    if theta_version == version:
        alpha = torch.ones_like(v_behave)
    else:
        alpha = torch.where(span > 0, gap / span.clamp(min=1e-12), torch.zeros_like(v_behave))
    alpha = torch.where(versions >= 0, alpha.clamp(0.0, 1.0), torch.zeros_like(alpha))
    lb = behavior_logprobs.detach()
    return lb + alpha.to(lb.dtype) * (logprobs.detach() - lb)


def correction_weights(
    old_logprobs: Tensor,
    behavior_logprobs: Tensor,
    mask: Tensor,
    *,
    cap: float = 2.0,
    mode: str = "truncate",
    level: str = "token",
    reject: str | None = None,
    low: float = 0.5,
    high: float = 2.0,
) -> tuple[Tensor, dict[str, Any]]:
    """The per-token weight ``[B, T]`` the policy loss is multiplied by (importance weight
    times rejection mask) and its metrics."""
    w = importance_weights(old_logprobs, behavior_logprobs, mask, cap=cap, mode=mode, level=level)
    metrics = {
        "is_weight_mean": masked_mean(w, mask),
        "is_weight_max": masked_max(w, mask),
    }
    raw = importance_weights(
        old_logprobs, behavior_logprobs, mask, cap=float("inf"), mode="truncate", level=level
    )
    metrics["is_capped_frac"] = masked_mean(raw > cap, mask)
    if reject is not None:
        keep = rejection_mask(reject, old_logprobs, behavior_logprobs, mask, low=low, high=high)
        w = w * keep.to(w.dtype)
        metrics["is_rejected_frac"] = masked_mean(1.0 - keep.to(torch.float32), mask)
    return w, metrics
