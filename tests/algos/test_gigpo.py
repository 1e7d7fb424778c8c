"""GiGPO against values computed by hand from Feng et al. 2025, eq. 3-7."""

from __future__ import annotations

import pytest
import torch

from agentrl.algos import compute_advantages
from agentrl.algos.gigpo import anchor_groups, step_returns


def _turn_index(turns_per_row: list[list[int]]) -> torch.Tensor:
    """A [B, T] turn index from each row's tokens-per-turn (one untrained token between
    turns, marked -1)."""
    rows = []
    for row in turns_per_row:
        idx: list[int] = []
        for k, n in enumerate(row):
            idx += [k] * n + [-1]
        rows.append(idx)
    T = max(len(r) for r in rows)
    return torch.tensor([r + [-1] * (T - len(r)) for r in rows])


def _gigpo(rewards, process, states, tokens, **kw):
    K = max(len(p) for p in process)
    turn_rewards = torch.tensor([p + [0.0] * (K - len(p)) for p in process])
    turn_mask = torch.tensor([[1.0] * len(p) + [0.0] * (K - len(p)) for p in process])
    return compute_advantages(
        "gigpo",
        torch.tensor(rewards),
        torch.zeros(len(rewards), dtype=torch.long),
        turn_rewards=turn_rewards,
        turn_mask=turn_mask,
        turn_states=states,
        turn_index=_turn_index(tokens),
        **kw,
    )


def test_recurring_states_by_hand():
    # per-turn rewards r: A [0, 1], B [0, 0], C [0.5, 0]; totals 1, 0, 0.5 (mean 0.5)
    # A_E (no std) = .5, -.5, 0; step returns (gamma .5): A [.5, 1], B [0, 0], C [.5, 0]
    # state s0 {A0 .5, B0 0, C0 .5} mean 1/3 -> 1/6, -1/3, 1/6; s1 {A1 1, C1 0} -> .5, -.5;
    # s2 {B1} alone -> 0
    adv = _gigpo(
        rewards=[1.0, 0.0, 0.0],
        process=[[0.0, 0.0], [0.0, 0.0], [0.5, 0.0]],
        states=[["s0", "s1"], ["s0", "s2"], ["s0", "s1"]],
        tokens=[[2, 3], [1, 2], [2, 1]],
        omega=1.0,
        step_gamma=0.5,
        norm_by_std=False,
    )
    expected = [[2 / 3, 1.0], [-5 / 6, -0.5], [1 / 6, -0.5]]
    tokens = [[2, 3], [1, 2], [2, 1]]
    for i, row in enumerate(tokens):
        want = []
        for k, n in enumerate(row):
            want += [expected[i][k]] * n + [0.0]
        got = adv[i, : len(want)]
        assert torch.allclose(got, torch.tensor(want), atol=1e-6), (i, got, want)
        assert (adv[i, len(want) :] == 0).all()


def test_std_normalisation_and_omega_by_hand():
    # two rows, same states: totals 1 and 0 -> A_E = +-1/sqrt(2) / ... with unbiased std
    # std(1, 0) = sqrt(0.5); A_E = +-0.5 / sqrt(0.5) = +-0.7071
    # step returns (gamma 1): turn 0 {1, 0} -> +-0.7071; turn 1 {1, 0} -> +-0.7071
    adv = _gigpo(
        rewards=[1.0, 0.0],
        process=[[0.0, 0.0], [0.0, 0.0]],
        states=[["a", "b"], ["a", "b"]],
        tokens=[[1, 1], [1, 1]],
        omega=0.5,
        step_gamma=1.0,
    )
    a = 0.5 / 0.5**0.5
    assert adv[0, 0] == pytest.approx(a * 1.5, abs=1e-5)
    assert adv[1, 2] == pytest.approx(-a * 1.5, abs=1e-5)


def test_states_that_never_recur_leave_the_episode_advantage():
    rewards = [1.0, 0.0, 0.0, 1.0]
    adv = _gigpo(
        rewards=rewards,
        process=[[0.0, 0.0]] * 4,
        states=[[f"r{i}t0", f"r{i}t1"] for i in range(4)],
        tokens=[[1, 1]] * 4,
    )
    grpo = compute_advantages("grpo", torch.tensor(rewards), torch.zeros(4, dtype=torch.long))
    assert torch.allclose(adv[:, 0], grpo.float(), atol=1e-6)
    assert torch.allclose(adv[:, 2], grpo.float(), atol=1e-6)


def test_single_step_episodes_equal_grpo():
    rewards = [1.0, 0.0, 0.5, 0.0]
    grpo = compute_advantages("grpo", torch.tensor(rewards), torch.zeros(4, dtype=torch.long))
    # no state keys: exactly GRPO
    adv = _gigpo(rewards, [[0.0]] * 4, [[None]] * 4, [[3]] * 4, omega=1.0)
    assert torch.allclose(adv[:, :3], grpo.float()[:, None].expand(4, 3), atol=1e-6)
    # one shared start state: the step group is the episode group -> (1 + omega) * GRPO
    adv = _gigpo(rewards, [[0.0]] * 4, [["start"]] * 4, [[3]] * 4, omega=0.5)
    assert torch.allclose(adv[:, 0], 1.5 * grpo.float(), atol=1e-6)


def test_process_rewards_enter_the_step_returns():
    # r = [0.2, 1] vs [0, 0]: totals 1.2 / 0; turn 1 returns with gamma .5: 0.2 + .5 = .7
    R = step_returns(torch.tensor([[0.2, 1.0], [0.0, 0.0]]), torch.ones(2, 2), 0.5)
    assert torch.allclose(R, torch.tensor([[0.7, 1.0], [0.0, 0.0]], dtype=torch.float64))


def test_anchor_groups_are_per_task_group():
    ids = anchor_groups(
        torch.tensor([0, 0, 1]), [["x", None], ["x", "y"], ["x", "y"]], torch.ones(3, 2)
    )
    assert ids[0, 0] == ids[1, 0] != ids[2, 0]  # same key in another task: another group
    assert ids[0, 1] == -1
    assert ids[1, 1] != ids[2, 1]
