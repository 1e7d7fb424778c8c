"""Step rewards and state keys from a real episode, through the trace to the learner's rewards."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.envs.base import AssistantTurn, StepResult
from agentrl.envs.grid_walk import GridWalkEnv
from agentrl.learner.objective import Objective
from agentrl.learner.settings import AlgorithmSettings
from agentrl.rollout import EpisodeLimits, run_episode
from agentrl.samplers import SamplingParams
from agentrl.types import Batch, Trajectory, TrajectoryGroup

from .scripted import ScriptedToolEnv

pytestmark = pytest.mark.anyio


class ProgressEnv(ScriptedToolEnv):
    """A tool result each turn with a step reward of 0.25 * turn, and the turn as the
    state key; the last turn ends the episode with the outcome 1.0."""

    name = "progress"

    def state_key(self) -> Any:
        return ("turn", self.turn)

    async def step(self, turn: AssistantTurn) -> StepResult:
        result = await super().step(turn)
        if result.done:
            result.outcome = 1.0
        else:
            result.step_reward = 0.25 * self.turn
        return result


async def _episode(sampler, renderer) -> Trajectory:
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3)
    limits = EpisodeLimits(max_turns=5, max_tokens=400)
    return await run_episode(
        {"id": "t0", "question": "Compute 1 + 1."},
        ProgressEnv(tool_turns=2),
        sampler,
        renderer,
        params,
        limits,
        seed=0,
    )


async def test_step_rewards_reach_the_learner_on_each_turns_last_token(sampler, renderer, tmp_path):
    traj = await _episode(sampler, renderer)
    assert traj.status == "ok", traj.error
    assert [t.step_reward for t in traj.turns] == [0.25, 0.5, None]
    assert [t.state for t in traj.turns] == ["('turn', 0)", "('turn', 1)", "('turn', 2)"]
    assert traj.reward == 1.0 and "outcome_turn" not in traj.metadata
    assert traj.process_rewards == [0.25, 0.5, 0.0]  # the outcome is not a step reward

    # the trace round-trips, and old traces (without the fields) still load
    again = Trajectory.from_json(traj.to_json())
    assert again.process_rewards == traj.process_rewards and again.turn_states == traj.turn_states
    old = traj.to_dict()
    for t in old["turns"]:
        t.pop("step_reward", None), t.pop("state")
    assert Trajectory.from_dict(old).process_rewards == [0.0, 0.0, 0.0]
    # traces written before the split named the turn whose step reward was the outcome
    before = traj.to_dict()
    before["turns"][2]["step_reward"], before["metadata"]["outcome_turn"] = 1.0, 2
    migrated = Trajectory.from_dict(before)
    assert migrated.process_rewards == [0.25, 0.5, 0.0] and migrated.reward == 1.0
    assert "outcome_turn" not in migrated.metadata

    batch = Batch.from_groups([TrajectoryGroup("t0", [traj, _copy(traj, 0.0)])])
    spans = traj.turn_spans
    assert batch.turn_ends[0].tolist() == [end - 1 for _, end in spans]
    assert batch.turn_rewards[0].tolist() == [0.25, 0.5, 0.0]

    # token-level rewards (GAE, REINFORCE++): weighted process rewards on each turn's last
    # token, the outcome on the last trained token
    objective = Objective(AlgorithmSettings(), attribution="soft", norm_length=64, step_weight=2.0)
    tok = objective.token_rewards(batch, batch.rewards)
    nonzero = {int(i): float(tok[0, i]) for i in torch.nonzero(tok[0]).flatten()}
    assert nonzero == {spans[0][1] - 1: 0.5, spans[1][1] - 1: 1.0, spans[2][1] - 1: 1.0}
    # sequence-level estimators see the return: outcome + weighted process rewards
    rewards, metrics = objective.shaped_rewards(batch)
    adv, mask, _ = objective.advantages(batch, rewards, None)
    assert objective.sequence_returns(batch, rewards).tolist() == [2.5, 0.0]
    assert (adv[0][mask[0] > 0] > 0).all() and (adv[1][mask[1] > 0] < 0).all()
    assert metrics["reward/process_sum_mean"] == pytest.approx(0.75)
    # step_weight 0 drops them
    off = Objective(AlgorithmSettings(), attribution="soft", norm_length=64, step_weight=0.0)
    assert torch.count_nonzero(off.token_rewards(batch, batch.rewards)[0]) == 1

    # agentrl inspect shows them
    path = tmp_path / "trajectories.jsonl"
    path.write_text(TrajectoryGroup("t0", [traj]).to_json() + "\n")
    out = CliRunner().invoke(app, ["inspect", str(path)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "step reward 0.25" in out.output and "state ('turn', 1)" in out.output
    assert "step rewards by turn: [0.25, 0.5, -] (outcome 1)" in out.output


def _copy(traj: Trajectory, reward: float) -> Trajectory:
    other = Trajectory.from_dict(traj.to_dict())
    other.traj_id, other.reward = "other", reward
    for turn in other.turns:
        turn.step_reward = None
    return other


async def test_grid_walk_gives_recurring_state_keys(sampler, renderer):
    env = GridWalkEnv(size=3, progress_reward=0.1)
    task = next(env.tasks(seed=0))
    params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=1)
    limits = EpisodeLimits(max_turns=3, max_tokens=400)
    trajs = [
        await run_episode(task, env, sampler, renderer, params, limits, seed=s) for s in range(2)
    ]
    start = f"{task['start'][0]},{task['start'][1]}"
    for t in trajs:
        assert t.turns and t.turns[0].state == start  # every episode acts from the start cell
    # the rules, driven by hand: moving closer is a process reward, the goal ends it
    walker = env.spawn()
    await walker.reset({"id": "x", "start": [0, 0], "goal": [0, 2]})
    assert walker.state_key() == "0,0"
    first = await walker.step(AssistantTurn("I go right.", [1]))
    assert first.step_reward == pytest.approx(0.1) and first.outcome is None
    assert not first.done and walker.state_key() == "0,1"
    wall = await walker.step(AssistantTurn("up", [1]))
    assert wall.step_reward is None and "wall" in wall.observations[0]["content"]
    done = await walker.step(AssistantTurn("RIGHT", [1]))
    assert done.done and done.outcome == 1.0 and done.step_reward is None
