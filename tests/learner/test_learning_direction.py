"""Training moves the policy the right way: one step raises the rewarded tokens' log-probs.

For every registered advantage estimator, policy loss and aggregation (iterated from the
registries, so one registered later is covered without editing this file) and for the
named recipes (Dr.GRPO, RLOO, REINFORCE++, GSPO, DAPO, PPO+GAE), one learner step at a
large learning rate on groups that mix rewarded and unrewarded samples must raise the mean
log-prob of the rewarded samples' model tokens relative to the unrewarded ones. A sign
error anywhere between the reward and the gradient (advantage, ratio, loss, aggregation,
importance weight) turns the gap the other way and fails these tests.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable

import pytest
import torch

from agentrl.algos import ADVANTAGES, AGGREGATIONS, POLICY_LOSSES, register_policy_loss
from agentrl.errors import ConfigError
from agentrl.learner import Learner
from agentrl.learner.objective import Objective, turn_index
from agentrl.run.settings import resolve
from agentrl.types import Batch, TrajectoryGroup, Turn
from tests.learner.conftest import make_cfg
from tests.learner.test_learner import ALGORITHMS

# a large step (Adam moves each weight by ~lr) so the effect dwarfs numerical noise, small
# enough that the first-order direction still decides the outcome
LR = 3e-3
# the gap must grow by at least this much (nats per token): a sign error shrinks it by a
# similar amount, so a no-op or a wrong-way update cannot pass
MIN_GAIN = 0.05

# estimators registered here today; one that is registered later and needs inputs these
# groups lack (a critic, tree ids, step rewards) may skip, these may not
KNOWN_ADVANTAGES = {
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "gae",
    "tree_grpo",
    "gigpo",
    "raft",
}


def _rewarded_gap(learner: Learner, groups: list[TrajectoryGroup]) -> float:
    """Mean log-prob of rewarded model tokens minus that of unrewarded ones."""
    with torch.no_grad():
        lp = learner.compute_logprobs(groups)
    good, bad = [], []
    row = 0
    for group in groups:
        for traj in group.trajectories:
            mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
            tokens = lp[row, : traj.num_tokens][mask]
            (good if traj.reward > 0 else bad).append(tokens)
            row += 1
    assert good and bad, "the groups must mix rewarded and unrewarded samples"
    return float(torch.cat(good).mean() - torch.cat(bad).mean())


def _gain(
    algorithm: dict, fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> float:
    cfg = make_cfg(algorithm=algorithm, learner={"lr": LR, "grad_clip": 1e6})
    learner = Learner(fresh_model(), None, resolve(cfg).learner)
    before = _rewarded_gap(learner, groups)
    metrics = learner.step(groups)
    assert metrics["nonfinite_skipped"] == 0
    return _rewarded_gap(learner, groups) - before


def _check(
    label: str,
    algorithm: dict,
    fresh_model: Callable[[], torch.nn.Module],
    groups: list[TrajectoryGroup],
) -> None:
    gain = _gain(algorithm, fresh_model, groups)
    assert gain > MIN_GAIN, (
        f"{label}: one step moved the rewarded-minus-unrewarded log-prob gap by {gain:+.4f} "
        f"(expected > {MIN_GAIN}): the update does not favour rewarded tokens"
    )


def _advantage_setting(name: str) -> dict:
    setting: dict = {"advantage": name}
    if ADVANTAGES.needs_critic(name):
        setting["critic"] = True
    return setting


@pytest.fixture(scope="module")
def turn_groups(groups: list[TrajectoryGroup]) -> list[TrajectoryGroup]:
    """The same samples with a state key per turn: every first turn acts from the task's
    start state, the second from one of two cells, each cell reached by one rewarded and
    one unrewarded sample of the group (so GiGPO's step groups carry a signal)."""
    out = copy.deepcopy(groups)
    for group in out:
        seen: dict[float, int] = {}
        for traj in group.trajectories:
            cell = seen[traj.reward] = seen.get(traj.reward, -1) + 1
            traj.turns = [Turn(index=0, state="start"), Turn(index=1, state=f"cell{cell % 2}")]
    return out


@pytest.mark.parametrize("name", ADVANTAGES.names())
def test_every_advantage_favours_rewarded_tokens(
    name: str,
    fresh_model: Callable[[], torch.nn.Module],
    groups: list[TrajectoryGroup],
    turn_groups: list[TrajectoryGroup],
) -> None:
    setting = _advantage_setting(name)
    if "turn_states" in ADVANTAGES.inputs(name):  # GiGPO: with states, not GRPO in disguise
        groups = turn_groups
    try:
        _check(f"advantage {name}", setting, fresh_model, groups)
    except ConfigError as err:
        if name in KNOWN_ADVANTAGES:
            raise
        pytest.skip(f"advantage {name} needs inputs these groups lack: {err}")


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_every_policy_loss_favours_rewarded_tokens(
    name: str, fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> None:
    _check(f"policy loss {name}", {"advantage": "grpo", "policy_loss": name}, fresh_model, groups)


@pytest.mark.parametrize("agg", AGGREGATIONS.names())
def test_every_aggregation_favours_rewarded_tokens(
    agg: str, fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> None:
    _check(f"aggregation {agg}", {"advantage": "grpo", "agg": agg}, fresh_model, groups)


@pytest.mark.parametrize("recipe", list(ALGORITHMS))
def test_every_recipe_favours_rewarded_tokens(
    recipe: str, fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> None:
    _check(f"recipe {recipe}", ALGORITHMS[recipe], fresh_model, groups)


@pytest.mark.parametrize("correction", ["tis", "decoupled"])
def test_off_policy_corrections_favour_rewarded_tokens(
    correction: str, fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> None:
    _check(f"off_policy {correction}", {"off_policy": correction}, fresh_model, groups)


# the losses for stale data (agentrl.algos.stale) and RAFT's (agentrl.algos.raft): the
# suite above covers them from the registry; this shows the check catches a sign error in each
NEW_LOSSES = ("cispo", "sapo", "m2po", "dppo_kl", "reinforce")


@pytest.mark.parametrize("name", NEW_LOSSES)
def test_a_sign_flipped_new_loss_fails_the_direction_check(
    name: str, fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> None:
    fn = POLICY_LOSSES.get(name)

    @functools.wraps(fn)  # keeps the signature: the same options and clip settings reach it
    def flipped(logprobs, old_logprobs, advantages, mask, **kw):  # type: ignore[no-untyped-def]
        return fn(logprobs, old_logprobs, -advantages, mask, **kw)

    flipped_name = f"{name}_sign_flipped_test"
    register_policy_loss(flipped_name, override=True)(flipped)
    try:
        gain = _gain({"advantage": "grpo", "policy_loss": flipped_name}, fresh_model, groups)
    finally:
        POLICY_LOSSES._fns.pop(flipped_name, None)
    assert gain < -MIN_GAIN, (
        f"{name} with the advantage's sign flipped moved the gap by {gain:+.4f}"
    )


def test_gigpos_turn_states_reach_its_step_groups(
    groups: list[TrajectoryGroup], turn_groups: list[TrajectoryGroup]
) -> None:
    """The groups GiGPO's direction case trains on give it step groups: its advantages
    differ from the stateless ones (GRPO's) on both turns."""
    cfg = make_cfg(algorithm={"advantage": "gigpo"})
    objective = Objective.from_settings(resolve(cfg).objective)
    with_states = Batch.from_groups(turn_groups)
    without = Batch.from_groups(groups)
    assert all(s is not None for row in with_states.turn_states for s in row)
    a1, mask, _ = objective.advantages(with_states, with_states.rewards, None)
    a0, _, _ = objective.advantages(without, without.rewards, None)
    ti = turn_index(with_states.turn_ends, with_states.loss_mask)
    for k in (0, 1):
        on_turn = (ti == k) & (mask > 0)
        assert not torch.allclose(a1[on_turn], a0[on_turn]), f"turn {k} got GRPO's advantage"
