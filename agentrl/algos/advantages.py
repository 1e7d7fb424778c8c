"""Advantage estimators: group baselines for outcome rewards, and GAE for per-token values.

Group estimators take outcome rewards ``[B]`` and ``group_ids [B]`` (any integers; rows
with equal ids form one group) and are vectorised with ``index_add`` -- no per-group
Python loops. ``valid`` (``[B]``, 0 for ``infra_error`` rows) removes rows from their
group's statistics; such rows get advantage 0. A group with fewer than two valid rows has
no baseline to compare against and gets advantage 0 (except ``reinforce_pp``, which never
looks at groups). GAE is registered with ``needs_critic=True``: it also takes the critic's
values and the loss mask and returns per-token advantages and value targets (see
:mod:`agentrl.algos.registry` for the contract). Each estimator's keyword parameters are
its options: nothing else is swallowed, so a misspelt option is an error, not a no-op.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from agentrl.algos.registry import ADVANTAGES, register_advantage


def _check_rows(rewards: Tensor, group_ids: Tensor | None, valid: Tensor | None) -> Tensor:
    if rewards.dim() != 1:
        raise ValueError(
            f"rewards must be a 1-D tensor of outcome rewards [B] (got shape {tuple(rewards.shape)})"
        )
    if group_ids is not None and group_ids.shape != rewards.shape:
        raise ValueError(
            f"group_ids must have the shape of rewards {tuple(rewards.shape)} "
            f"(got {tuple(group_ids.shape)})"
        )
    if valid is None:
        return torch.ones_like(rewards, dtype=torch.float64)
    if valid.shape != rewards.shape:
        raise ValueError(
            f"valid must have the shape of rewards {tuple(rewards.shape)} (got {tuple(valid.shape)})"
        )
    return valid.to(torch.float64)


def _out(adv: Tensor, rewards: Tensor) -> Tensor:
    """Advantages in the rewards' floating dtype (float32 for integer rewards)."""
    return adv.to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def _clean(rewards: Tensor, v: Tensor) -> Tensor:
    """Rewards as float64 with invalid rows zeroed (they may be NaN after an infra error).

    Statistics run in float64 so an all-equal group centres to ~1e-16, not to float32
    rounding noise that the std division would blow up.
    """
    r = rewards.to(torch.float64)
    return torch.where(v > 0, r, torch.zeros_like(r))


def _group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """(index of each row's group in 0..n_groups-1, n_groups).

    Small non-negative integer ids (like ``Batch.group_index``) are used as they are;
    anything else is compacted with ``torch.unique`` (a sort).
    """
    if group_ids.numel() == 0:
        return group_ids.long(), 0
    if not group_ids.is_floating_point():
        lo, hi = torch.aminmax(group_ids)
        if int(lo) >= 0 and int(hi) < 4 * group_ids.numel() + 16:
            return group_ids.long(), int(hi) + 1
    _, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(inverse.max()) + 1


def group_stats(
    rewards: Tensor, group_ids: Tensor, valid: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-row group (count, sum, mean, unbiased std) over valid rows, each ``[B]`` float64."""
    v = _check_rows(rewards, group_ids, valid)
    r = _clean(rewards, v)
    inverse, n_groups = _group_index(group_ids)
    count = torch.zeros(n_groups, dtype=torch.float64, device=r.device).index_add_(0, inverse, v)
    total = torch.zeros_like(count).index_add_(0, inverse, r)
    mean = total / count.clamp(min=1.0)
    sq = (r - mean[inverse]) ** 2 * v
    ss = torch.zeros_like(count).index_add_(0, inverse, sq)
    std = (ss / (count - 1.0).clamp(min=1.0)).sqrt()
    return count[inverse], total[inverse], mean[inverse], std[inverse]


# GRPO (Shao et al. 2024, eq. 3 outcome supervision): A_i = (r_i - mean(r)) / std(r)
@register_advantage("grpo")
def grpo(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    valid: Tensor | None = None,
    eps: float = 1e-6,
    norm_by_std: bool = True,
) -> Tensor:
    v = _check_rows(rewards, group_ids, valid)
    count, _, mean, std = group_stats(rewards, group_ids, v)
    adv = _clean(rewards, v) - mean
    if norm_by_std:
        adv = adv / (std + eps)
    return _out(torch.where((count > 1) & (v > 0), adv, torch.zeros_like(adv)), rewards)


# Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-like training", eq. 3): A_i = r_i - mean(r)
@register_advantage("dr_grpo")
def dr_grpo(rewards: Tensor, group_ids: Tensor, *, valid: Tensor | None = None) -> Tensor:
    return grpo(rewards, group_ids, valid=valid, norm_by_std=False)


# RLOO (Ahmadian et al. 2024, eq. 7): A_i = r_i - 1/(k-1) * sum_{j != i} r_j
@register_advantage("rloo")
def rloo(rewards: Tensor, group_ids: Tensor, *, valid: Tensor | None = None) -> Tensor:
    v = _check_rows(rewards, group_ids, valid)
    count, total, _, _ = group_stats(rewards, group_ids, v)
    r = _clean(rewards, v)
    baseline = (total - r) / (count - 1.0).clamp(min=1.0)
    adv = r - baseline
    return _out(torch.where((count > 1) & (v > 0), adv, torch.zeros_like(adv)), rewards)


def _whiten(x: Tensor, v: Tensor, eps: float, mask: Tensor | None = None) -> Tensor:
    """Whiten per-row values over the batch. With ``mask`` ``[B, T]`` every row counts
    once per trained token (the statistics of the values broadcast over the tokens, as
    the per-token path and verl compute them); without it, once per row."""
    w = v if mask is None else v * mask.to(torch.float64).sum(dim=1)
    n = w.sum()
    if n < 2:
        return torch.zeros_like(x)
    mean = (x * w).sum() / n
    var = (((x - mean) ** 2) * w).sum() / (n - 1)
    return torch.where(w > 0, (x - mean) / (var.sqrt() + eps), torch.zeros_like(x))


# REINFORCE++ (Hu 2025, eq. 8-9): A = (r - mean_batch(r)) / std_batch(r) -- no group baseline.
# With per-token rewards r_t (eq. 5: the outcome on the last token minus beta * KL_t):
# A_t = whiten_batch(G_t), G_t = sum_{s >= t} gamma^(s-t) r_s over the trained tokens.
@register_advantage("reinforce_pp", token_rewards=True, inputs=("mask", "gamma"))
def reinforce_pp(
    rewards: Tensor,
    group_ids: Tensor | None = None,
    *,
    valid: Tensor | None = None,
    eps: float = 1e-6,
    mask: Tensor | None = None,
    gamma: float = 1.0,
) -> Tensor:
    if rewards.dim() == 2:
        if mask is None or mask.shape != rewards.shape:
            raise ValueError(
                "per-token rewards [B, T] need mask= [B, T] of the same shape (got "
                f"{None if mask is None else tuple(mask.shape)} for {tuple(rewards.shape)})"
            )
        m = mask.to(torch.float32)
        if valid is not None:
            m = m * valid.to(torch.float32)[:, None]
        zeros = torch.zeros_like(rewards, dtype=torch.float32)
        returns, _ = compute_gae(rewards * m, zeros, m, gamma=gamma, lam=1.0)
        return whiten_tokens(returns, m, eps)
    v = _check_rows(rewards, group_ids, valid)
    return _out(_whiten(_clean(rewards, v), v, eps, mask), rewards)


# REINFORCE++-baseline (Hu 2025, sec. 3.3): subtract the group mean, then whiten over the
# batch's tokens (each row weighted by its trained tokens when mask= [B, T] is given, as
# the learner does; per row without it)
@register_advantage("reinforce_pp_baseline", inputs=("mask",))
def reinforce_pp_baseline(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    valid: Tensor | None = None,
    eps: float = 1e-6,
    mask: Tensor | None = None,
) -> Tensor:
    v = _check_rows(rewards, group_ids, valid)
    _, _, mean, _ = group_stats(rewards, group_ids, v)
    return _out(_whiten(_clean(rewards, v) - mean, v, eps, mask), rewards)


def estimate_advantages(
    name: str,
    rewards: Tensor,
    group_ids: Tensor,
    *,
    valid: Tensor | None = None,
    values: Tensor | None = None,
    mask: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    **options: Any,
) -> tuple[Tensor, Tensor | None]:
    """``(advantages, returns)`` with the estimator registered as ``name``.

    Routed by the estimator's registration, never by its signature: outcome rewards ``[B]``
    go to every estimator, per-token rewards ``[B, T]`` (with ``mask``) only to one
    registered with ``token_rewards=True`` or ``needs_critic=True`` (a ValueError names the
    estimator and the shape it takes otherwise). ``options`` go to the estimator
    (``eps=``, ...). Estimators registered with ``needs_critic=True`` (``"gae"``) also get
    ``values`` and ``mask`` ``[B, T]``, ``gamma`` and ``lam``, and give per-token
    advantages plus the value targets ``returns`` ``[B, T]``; for the others ``returns``
    is None and ``mask`` / ``gamma`` reach an outcome estimator that declares them as
    inputs (:meth:`~agentrl.algos.registry.AdvantageRegistry.inputs`).
    """
    fn = ADVANTAGES.get(name)
    critic = ADVANTAGES.needs_critic(name)
    token_level = ADVANTAGES.takes_token_rewards(name)  # needs_critic implies it
    _check_reward_shape(name, rewards, token_level)
    if critic:
        advantages, returns = fn(
            rewards, group_ids, valid=valid, values=values, mask=mask, gamma=gamma, lam=lam,
            **options,
        )  # fmt: skip
        return advantages, returns
    if values is not None:
        raise ValueError(
            f"advantage '{name}' uses no critic, so it takes no values=; pass values only to "
            f"an estimator registered with needs_critic=True (such as 'gae')"
        )
    if rewards.dim() == 2:  # per-token rewards: a token_rewards estimator (REINFORCE++)
        return fn(rewards, group_ids, valid=valid, mask=mask, gamma=gamma, **options), None
    if valid is not None:
        options["valid"] = valid
    declared = ADVANTAGES.inputs(name)
    if mask is not None and "mask" in declared:  # e.g. to weight rows by length
        options["mask"] = mask
    if "gamma" in declared:
        options["gamma"] = gamma
    return fn(rewards, group_ids, **options), None


def _check_reward_shape(name: str, rewards: Tensor, token_level: bool) -> None:
    """Outcome rewards ``[B]`` for any estimator, ``[B, T]`` for a token-level one."""
    if rewards.dim() == 1 or (rewards.dim() == 2 and token_level):
        return
    if token_level:
        takes = "outcome rewards [B] or per-token rewards [B, T]"
    else:
        others = ", ".join(_token_level_names())
        takes = (
            "outcome rewards [B] (one per row); per-token rewards [B, T] go to an estimator "
            f"registered with token_rewards=True or needs_critic=True ({others})"
        )
    raise ValueError(
        f"advantage '{name}' takes {takes}; got rewards of shape {tuple(rewards.shape)}"
    )


def _token_level_names() -> list[str]:
    return [n for n in ADVANTAGES.names() if ADVANTAGES.takes_token_rewards(n)]


def compute_advantages(name: str, rewards: Tensor, group_ids: Tensor, **kw: Any) -> Tensor:
    """Advantages from outcome rewards ``[B]`` with the estimator registered as ``name``.

    ``kw`` goes to :func:`estimate_advantages` (``valid=``, ``eps=``, ...). ``"gae"`` also
    works here when given ``values`` and ``mask`` ``[B, T]``: the outcome reward is placed
    on each row's last trained token and the result is per token ``[B, T]``.
    """
    return estimate_advantages(name, rewards, group_ids, **kw)[0]


# GAE (Schulman et al. 2016, eq. 16): A_t = sum_l (gamma*lam)^l delta_{t+l},
# delta_t = r_t + gamma V_{t+1} - V_t, where t ranges over trained (mask=1) positions only.
def compute_gae(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Per-token GAE on ``[B, T]`` -> ``(advantages, returns)``.

    Positions with ``mask == 0`` (prompt, observation tokens, padding) are not steps: the
    recursion passes through them carrying the next trained token's value and advantage
    unchanged, so the last model token before a tool result bootstraps from the first
    model token after it. Rewards must sit on trained positions (rewards on masked
    positions are ignored). Advantages and returns are 0 where ``mask == 0``.
    The loop runs over T (vectorised over B); it is inherently sequential.
    """
    if not (rewards.shape == values.shape == mask.shape) or rewards.dim() != 2:
        raise ValueError(
            "rewards, values and mask must all be [B, T] with the same shape (got "
            f"{tuple(rewards.shape)}, {tuple(values.shape)}, {tuple(mask.shape)})"
        )
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lam must be in [0, 1] (got gamma={gamma}, lam={lam})")
    with torch.no_grad():
        m = mask.to(torch.float32)
        r = rewards.to(torch.float32)
        v = values.to(torch.float32)
        B, T = r.shape
        next_value = torch.zeros(B, dtype=torch.float32, device=r.device)
        next_adv = torch.zeros_like(next_value)
        adv = torch.zeros_like(r)
        for t in range(T - 1, -1, -1):
            delta = r[:, t] + gamma * next_value - v[:, t]
            a_t = delta + gamma * lam * next_adv
            mt = m[:, t]
            adv[:, t] = a_t * mt
            next_adv = torch.where(mt > 0, a_t, next_adv)
            next_value = torch.where(mt > 0, v[:, t], next_value)
        returns = (adv + v) * m
    return adv, returns


def place_outcome_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """Scatter outcome rewards ``[B]`` onto each row's last trained token -> ``[B, T]``."""
    T = mask.shape[1]
    pos = torch.arange(T, device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, pos, torch.full_like(pos, -1)).max(dim=1).values
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    has = last >= 0
    rows = torch.arange(mask.shape[0], device=mask.device)[has]
    out[rows, last[has]] = rewards.to(torch.float32)[has]
    return out


def whiten_tokens(x: Tensor, mask: Tensor, eps: float = 1e-6) -> Tensor:
    """``x`` shifted and scaled to mean 0, std 1 over the positions where ``mask`` is set."""
    n = mask.sum()
    if n <= 1:
        return x
    mean = (x * mask).sum() / n
    std = (((x - mean) ** 2) * mask).sum().div(n - 1).sqrt()
    return (x - mean) / (std + eps) * mask


# GAE with outcome rewards on each row's last trained token, advantages whitened over the
# batch's trained tokens as PPO implementations do (whiten_advantages=False keeps them raw).
@register_advantage("gae", needs_critic=True, inputs=("mask", "gamma"))
def gae(
    rewards: Tensor,
    group_ids: Tensor | None = None,
    *,
    valid: Tensor | None = None,
    values: Tensor | None = None,
    mask: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten_advantages: bool = True,
) -> tuple[Tensor, Tensor]:
    if values is None or mask is None:
        raise ValueError(
            "advantage 'gae' needs per-token values= and mask= [B, T] "
            "(or call agentrl.algos.compute_gae(rewards, values, mask, gamma, lam))"
        )
    m = mask.to(torch.float32)
    if valid is not None:
        m = m * valid.to(torch.float32)[:, None]
    token_rewards = rewards if rewards.dim() == 2 else place_outcome_rewards(rewards, m)
    adv, returns = compute_gae(token_rewards, values, m, gamma, lam)
    if whiten_advantages:
        adv = whiten_tokens(adv, m)
    return adv, returns


def dynamic_sampling_mask(
    rewards: Tensor,
    group_ids: Tensor,
    valid: Tensor | None = None,
    atol: float = 0.0,
    min_std: float = 0.0,
) -> Tensor:
    """DAPO dynamic sampling (Yu et al. 2025, eq. 11): keep groups whose rewards differ.

    Returns a bool ``[B]``: True for rows of groups whose valid rewards are not all equal
    (within ``atol``) and, when ``min_std > 0``, whose unbiased std (the one GRPO divides
    by) is at least ``min_std``. Groups with fewer than two valid rows are dropped too.
    """
    v = _check_rows(rewards, group_ids, valid)
    inverse, n_groups = _group_index(group_ids)
    r = _clean(rewards, v)
    big = torch.finfo(torch.float32).max
    hi = torch.full((n_groups,), -big, dtype=r.dtype, device=r.device).scatter_reduce(
        0, inverse, torch.where(v > 0, r, torch.full_like(r, -big)), reduce="amax"
    )
    lo = torch.full((n_groups,), big, dtype=r.dtype, device=r.device).scatter_reduce(
        0, inverse, torch.where(v > 0, r, torch.full_like(r, big)), reduce="amin"
    )
    count = torch.zeros(n_groups, dtype=v.dtype, device=r.device).index_add_(0, inverse, v)
    keep = ((count >= 2) & ((hi - lo) > atol))[inverse]
    if min_std > 0:
        keep = keep & (group_stats(rewards, group_ids, v)[3] >= min_std)
    return keep
