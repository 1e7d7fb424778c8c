"""GiGPO: group-in-group advantages for multi-turn agents (Feng et al. 2025).

Two nested groups. The episode group is GRPO's: the G trajectories of one task, compared by
their total return R(tau) = sum_k r_k. The step groups collect, across the same task's
trajectories, every action taken from one *anchor state* (turns whose environment state
key is equal); within a step group each action is compared by its discounted return from
that step, R_k = sum_{j >= k} step_gamma^(j-k) r_j. A turn's tokens get

    A = A_E(tau) + omega * A_S(a_k),
    A_E = (R(tau) - mean_group R) / std_group R,  A_S = (R_k - mean_step R) / std_step R

(Feng et al. 2025, eq. 3-7). Per-turn rewards r_k are the weighted process rewards of the
turns (``turn_rewards``) plus the outcome on each row's last turn. Conventions of this
package: a group (episode or step) with fewer than two valid members has no baseline and
contributes 0 (verl-agent instead uses the raw return there); a turn without a state key
joins no step group (A_S = 0). Without state keys GiGPO is GRPO on the total return; with a
single-step task every trajectory acts from the same initial state, so the step group is
the episode group and A = (1 + omega) * A_E.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from agentrl.algos.advantages import grpo
from agentrl.algos.registry import register_advantage


def step_returns(turn_rewards: Tensor, turn_mask: Tensor, gamma: float) -> Tensor:
    """Discounted returns from each turn ``[B, K]``: R_k = r_k + gamma * R_{k+1} over the
    row's real turns (0 past them)."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"step_gamma must be in [0, 1] (got {gamma})")
    r = turn_rewards.to(torch.float64) * turn_mask
    out = torch.zeros_like(r)
    nxt = torch.zeros(r.shape[0], dtype=r.dtype, device=r.device)
    for k in range(r.shape[1] - 1, -1, -1):
        nxt = (r[:, k] + gamma * nxt) * turn_mask[:, k]
        out[:, k] = nxt
    return out


def anchor_groups(
    group_ids: Tensor, turn_states: Sequence[Sequence[str | None]], turn_mask: Tensor
) -> Tensor:
    """An id per turn ``[B, K]`` shared by the turns of one task group that acted from the
    same state; -1 for turns without a state key (and past a row's turns)."""
    B, K = turn_mask.shape
    ids = torch.full((B, K), -1, dtype=torch.long)
    table: dict[tuple[int, str], int] = {}
    for i in range(B):
        g = int(group_ids[i])
        states = turn_states[i] if i < len(turn_states) else ()
        for k, key in enumerate(list(states)[:K]):
            if key is not None and turn_mask[i, k] > 0:
                ids[i, k] = table.setdefault((g, key), len(table))
    return ids


# GiGPO (Feng et al. 2025, eq. 3-7): A = A_E(tau) + omega * A_S(a_k), step groups by anchor state
@register_advantage("gigpo", inputs=("turn_rewards", "turn_mask", "turn_states", "turn_index"))
def gigpo(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    valid: Tensor | None = None,
    turn_rewards: Tensor,
    turn_mask: Tensor,
    turn_states: Sequence[Sequence[str | None]],
    turn_index: Tensor,
    omega: float = 1.0,
    step_gamma: float = 0.95,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """Per-token advantages ``[B, T]`` (0 on untrained tokens).

    ``rewards`` ``[B]``: outcomes; ``turn_rewards`` / ``turn_mask`` ``[B, K]``: process
    rewards and real turns; ``turn_states``: per row, each turn's state key;
    ``turn_index`` ``[B, T]``: each trained token's turn (-1 elsewhere)."""
    if turn_rewards.shape != turn_mask.shape or turn_rewards.shape[0] != rewards.shape[0]:
        raise ValueError(
            "turn_rewards and turn_mask must both be [B, K] with B = len(rewards) (got "
            f"{tuple(turn_rewards.shape)}, {tuple(turn_mask.shape)}, {tuple(rewards.shape)})"
        )
    B, K = turn_mask.shape
    v = torch.ones(B, dtype=torch.float64) if valid is None else valid.to(torch.float64)
    tm = turn_mask.to(torch.float64)
    # r_k: process rewards, plus the outcome on each row's last real turn
    n_turns = tm.sum(dim=1).long()
    per_turn = turn_rewards.to(torch.float64) * tm
    rows = torch.arange(B)[n_turns > 0]
    per_turn[rows, n_turns[n_turns > 0] - 1] += rewards.to(torch.float64)[n_turns > 0]
    total = per_turn.sum(dim=1)
    adv_episode = grpo(total, group_ids, valid=v, eps=eps, norm_by_std=norm_by_std)

    returns = step_returns(per_turn, tm, step_gamma)
    anchors = anchor_groups(group_ids, turn_states, turn_mask)
    has = (anchors >= 0) & (v[:, None] > 0)
    adv_step = torch.zeros(B, K, dtype=torch.float64)
    if bool(has.any()):
        flat = grpo(returns[has], anchors[has], eps=eps, norm_by_std=norm_by_std)
        adv_step[has] = flat.to(torch.float64)

    per_turn_adv = adv_episode.to(torch.float64)[:, None] + omega * adv_step  # [B, K]
    idx = turn_index.clamp(min=0, max=max(K - 1, 0))
    tok = per_turn_adv.gather(1, idx)
    tok = torch.where((turn_index >= 0) & (v[:, None] > 0), tok, torch.zeros_like(tok))
    return tok.to(torch.float32)
