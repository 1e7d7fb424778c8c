"""Policy-gradient losses, off-policy corrections, value loss and entropy bonus.

Conventions: ``logprobs`` are the current policy's (with grad), ``old_logprobs`` are the
log-probs the ratio is taken against (pi_old; the proximal policy under ``decoupled``),
``behavior_logprobs`` are the sampler's. All per-token tensors are ``[B, T]`` and aligned;
``advantages`` may be ``[B]`` (broadcast over tokens) or ``[B, T]``. A registered loss
returns a per-token loss ``[B, T]`` plus metrics; :func:`policy_loss` then applies the
off-policy weight and aggregates. Metrics are floats or 0-dim tensors (left on the
device: :mod:`agentrl.algos.stats`; the learner reads them once a step).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from agentrl._suggest import suggest
from agentrl.algos.aggregation import aggregate
from agentrl.algos.offpolicy import correction_weights
from agentrl.algos.registry import POLICY_LOSSES, keyword_parameters, register_policy_loss
from agentrl.algos.stats import LOG_RATIO_CLAMP as _LOG_RATIO_CLAMP
from agentrl.algos.stats import masked_max, masked_mean, masked_min
from agentrl.errors import UnknownNameError

CORRECTIONS = ("none", "tis", "decoupled")


def _clip_objective(
    ratio: Tensor,
    adv: Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-element clipped surrogate loss -> (loss, clipped indicator, dual-clipped indicator)."""
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(pg_unclipped, pg_clipped)
    clipped = pg_clipped > pg_unclipped
    dual = torch.zeros_like(clipped)
    if dual_clip_c is not None:
        if dual_clip_c <= 1.0:
            raise ValueError(f"dual_clip_c must be > 1 (got {dual_clip_c})")
        # Dual-clip PPO (Ye et al. 2020, eq. 5): for A < 0 bound the loss by -c * A
        bound = -adv * dual_clip_c
        dual = (adv < 0) & (loss > bound)
        loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)
    return loss, clipped, dual


def _check_eps(eps_low: float, eps_high: float | None) -> tuple[float, float]:
    eps_high = eps_low if eps_high is None else eps_high
    if eps_low < 0 or eps_high < 0 or eps_low >= 1.0:
        raise ValueError(
            f"clip bounds need 0 <= eps_low < 1 and eps_high >= 0 (got {eps_low}, {eps_high})"
        )
    return eps_low, eps_high


# PPO clip (Schulman et al. 2017, eq. 7) with DAPO clip-higher (Yu et al. 2025, eq. 10):
# L_t = -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t),  r_t = pi_theta / pi_old
@register_policy_loss("ppo")
def ppo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    dual_clip_c: float | None = None,
) -> tuple[Tensor, dict[str, Any]]:
    eps_low, eps_high = _check_eps(eps_low, eps_high)
    log_ratio = (logprobs - old_logprobs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    loss, clipped, dual = _clip_objective(ratio, advantages, eps_low, eps_high, dual_clip_c)
    metrics = {
        "clip_frac": masked_mean(clipped, mask),
        "clip_frac_high": masked_mean(clipped & (advantages > 0), mask),
        "clip_frac_low": masked_mean(clipped & (advantages < 0), mask),
        "dual_clip_frac": masked_mean(dual, mask),
        "ratio_mean": masked_mean(ratio, mask),
        "ratio_max": masked_max(ratio, mask),
        "ratio_min": masked_min(ratio, mask),
    }
    return loss, metrics


def _seq_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    m = mask.to(logprobs.dtype)
    lengths = m.sum(dim=-1).clamp(min=1.0)
    return ((logprobs - old_logprobs) * m).sum(dim=-1) / lengths


def _seq_advantage(advantages: Tensor, mask: Tensor) -> Tensor:
    m = mask.to(advantages.dtype)
    return (advantages * m).sum(dim=-1) / m.sum(dim=-1).clamp(min=1.0)


# GSPO (Zheng et al. 2025, eq. 5-7): s_i = (pi_theta(y_i|x) / pi_old(y_i|x))^(1/|y_i|),
# L_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i), one value per sequence
# broadcast to its tokens (the paper's objective is agg="seq-mean-token-mean").
@register_policy_loss("gspo")
def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 3e-4,
    eps_high: float | None = 4e-4,
    dual_clip_c: float | None = None,
) -> tuple[Tensor, dict[str, Any]]:
    eps_low, eps_high = _check_eps(eps_low, eps_high)
    seq_log_ratio = _seq_log_ratio(logprobs, old_logprobs, mask)
    s = torch.exp(seq_log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    adv = _seq_advantage(advantages, mask)
    seq_loss, clipped, dual = _clip_objective(s, adv, eps_low, eps_high, dual_clip_c)
    has = mask.sum(dim=-1) > 0
    loss = seq_loss[:, None].expand_as(logprobs)
    metrics = {
        "clip_frac": masked_mean(clipped[:, None].expand_as(mask), mask),
        "seq_clip_frac": masked_mean(clipped, has),
        "dual_clip_frac": masked_mean(dual, has),
        "ratio_mean": masked_mean(s, has),
        "ratio_max": masked_max(s, has),
        "ratio_min": masked_min(s, has),
    }
    return loss, metrics


# GSPO-token (Zheng et al. 2025, eq. 13-14): s_{i,t} = sg[s_i] * pi_theta(y_t) / sg[pi_theta(y_t)]
# -- same value as s_i, per-token gradient, so token-level advantages A_{i,t} are allowed.
@register_policy_loss("gspo_token")
def gspo_token_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 3e-4,
    eps_high: float | None = 4e-4,
    dual_clip_c: float | None = None,
) -> tuple[Tensor, dict[str, Any]]:
    eps_low, eps_high = _check_eps(eps_low, eps_high)
    seq_log_ratio = _seq_log_ratio(logprobs, old_logprobs, mask).detach()
    log_s_tok = seq_log_ratio[:, None] + logprobs - logprobs.detach()
    s_tok = torch.exp(log_s_tok.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    loss, clipped, dual = _clip_objective(s_tok, advantages, eps_low, eps_high, dual_clip_c)
    metrics = {
        "clip_frac": masked_mean(clipped, mask),
        "dual_clip_frac": masked_mean(dual, mask),
        "ratio_mean": masked_mean(s_tok, mask),
        "ratio_max": masked_max(s_tok, mask),
        "ratio_min": masked_min(s_tok, mask),
    }
    return loss, metrics


_LOSS_INPUTS = ("logprobs", "old_logprobs", "advantages", "mask")


def _check_kwargs(name: str, fn: Any, kw: dict[str, Any]) -> None:
    named, takes_any = keyword_parameters(fn)
    if takes_any:
        return
    for key in kw:
        if key not in named:
            takes = [p for p in named if p not in _LOSS_INPUTS]
            raise ValueError(
                f"policy loss '{name}' does not take '{key}'{suggest(key, takes)}; "
                f"it takes: {', '.join(takes) or 'no keyword arguments'}"
            )


def policy_loss(
    name: str,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    agg: str = "token-mean",
    norm_length: int | None = None,
    denominator: float | None = None,
    behavior_logprobs: Tensor | None = None,
    correction: str = "none",
    is_cap: float = 2.0,
    is_mode: str = "truncate",
    is_level: str = "token",
    is_mask: str | None = None,
    is_mask_low: float = 0.5,
    is_mask_high: float = 2.0,
    **kw: Any,
) -> tuple[Tensor, dict[str, Any]]:
    """Aggregated policy loss (to minimise) and metrics, with an optional off-policy correction.

    ``correction``:
      * ``"none"``: ``old_logprobs`` is pi_old (often the behaviour log-probs themselves).
      * ``"tis"`` (truncated IS, Yao et al. 2025): ``old_logprobs`` are the learner's
        recomputed log-probs; each token's loss is weighted by
        ``min(pi_old / pi_behavior, is_cap)`` (detached) to correct sampler/learner mismatch.
      * ``"decoupled"`` (AReaL, Fu et al. 2025, eq. 5): ``old_logprobs`` are the proximal
        policy's; the ratio is pi_theta / pi_prox (clipped) and the loss is weighted by
        ``min(pi_prox / pi_behavior, is_cap)`` (detached); ``is_mode="mask"`` drops tokens
        above the cap instead, as AReaL's code does.
      Both weightings are the same formula; they differ in what ``old_logprobs`` holds.
      ``is_level="sequence"`` weights every token by its row's product of ratios;
      ``is_mask`` (``"token"``: IcePop, ``"geometric"``: the sequence's geometric-mean
      ratio) also drops tokens whose ratio lies outside ``[is_mask_low, is_mask_high]``.
      See :mod:`agentrl.algos.offpolicy`.
    ``kw`` goes to the loss (``eps_low``, ``eps_high``, ``dual_clip_c``). ``agg``,
    ``norm_length`` and ``denominator`` go to :func:`agentrl.algos.aggregate`.
    """
    fn = POLICY_LOSSES.get(name)
    _check_kwargs(name, fn, kw)
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(
            "logprobs, old_logprobs and mask must all be [B, T] with the same shape (got "
            f"{tuple(logprobs.shape)}, {tuple(old_logprobs.shape)}, {tuple(mask.shape)})"
        )
    if advantages.dim() == 1 and advantages.shape[0] == logprobs.shape[0]:
        advantages = advantages[:, None].expand_as(logprobs)
    elif advantages.shape != logprobs.shape:
        raise ValueError(
            f"advantages must be [B] or [B, T] matching logprobs {tuple(logprobs.shape)} "
            f"(got {tuple(advantages.shape)})"
        )
    if correction not in CORRECTIONS:
        raise UnknownNameError(
            f"unknown correction '{correction}'{suggest(correction, CORRECTIONS)}; "
            f"choose one of {', '.join(CORRECTIONS)}"
        )
    old_logprobs = old_logprobs.detach()
    advantages = advantages.detach().to(logprobs.dtype)
    tok_loss, metrics = fn(logprobs, old_logprobs, advantages, mask, **kw)

    if behavior_logprobs is not None:
        gap = (old_logprobs - behavior_logprobs).abs()
        metrics["behavior_gap_mean"] = masked_mean(gap, mask)
        metrics["behavior_gap_max"] = masked_max(gap, mask)
    if correction != "none":
        if behavior_logprobs is None:
            raise ValueError(
                f"correction='{correction}' needs behavior_logprobs= (the sampler's log-probs); "
                "pass them or use correction='none'"
            )
        w, w_metrics = correction_weights(
            old_logprobs,
            behavior_logprobs,
            mask,
            cap=is_cap,
            mode=is_mode,
            level=is_level,
            reject=is_mask,
            low=is_mask_low,
            high=is_mask_high,
        )
        tok_loss = tok_loss * w.to(tok_loss.dtype)
        metrics.update(w_metrics)
    elif is_mask is not None:
        raise ValueError(
            f"is_mask='{is_mask}' compares the learner's log-probs with the sampler's: use "
            "correction='tis' or 'decoupled' (with correction='none' they are the same)"
        )

    log_ratio = (logprobs.detach() - old_logprobs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    # k3 estimate of KL(pi_old || pi_theta) from tokens sampled by pi_old: with
    # r = pi_theta / pi_old, E_old[r - 1 - log r] = KL(pi_old || pi_theta) (never negative)
    metrics["approx_kl"] = masked_mean(torch.exp(log_ratio) - 1.0 - log_ratio, mask)
    loss = aggregate(agg, tok_loss, mask, norm_length=norm_length, denominator=denominator)
    metrics["pg_loss"] = loss.detach()
    return loss, metrics


# PPO value loss with clipping (Schulman et al. 2017 baselines; verl/OpenRLHF form):
# L = 1/2 max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2)
def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float | None = 0.2,
    agg: str = "token-mean",
    *,
    norm_length: int | None = None,
    denominator: float | None = None,
) -> tuple[Tensor, dict[str, Any]]:
    """Clipped value loss (``clip=None`` disables clipping) -> (scalar, metrics)."""
    returns = returns.detach()
    old_values = old_values.detach()
    unclipped = (values - returns) ** 2
    if clip is None:
        per_tok = 0.5 * unclipped
        clip_frac = 0.0
    else:
        if clip < 0:
            raise ValueError(f"value clip must be >= 0 or None (got {clip})")
        v_clipped = old_values + (values - old_values).clamp(-clip, clip)
        clipped = (v_clipped - returns) ** 2
        per_tok = 0.5 * torch.maximum(unclipped, clipped)
        clip_frac = masked_mean(clipped > unclipped, mask)
    loss = aggregate(agg, per_tok, mask, norm_length=norm_length, denominator=denominator)
    metrics = {
        "vf_loss": loss.detach(),
        "vf_clip_frac": clip_frac,
        "value_mean": masked_mean(values, mask),
        "return_mean": masked_mean(returns, mask),
    }
    return loss, metrics


def entropy_bonus(
    entropy: Tensor,
    mask: Tensor,
    agg: str = "token-mean",
    *,
    norm_length: int | None = None,
    denominator: float | None = None,
) -> Tensor:
    """Aggregated entropy over trained tokens; the learner adds ``-entropy_coef * bonus``."""
    return aggregate(agg, entropy, mask, norm_length=norm_length, denominator=denominator)
