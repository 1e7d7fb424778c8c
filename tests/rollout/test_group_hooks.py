"""Group hooks on real episodes: GHPO hints for all-fail groups, replay of a stored success."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agentrl.config import Config, RolloutConfig, SamplerConfig
from agentrl.envs.base import AssistantTurn, Environment, Message, StepResult
from agentrl.errors import ConfigError, UnknownNameError
from agentrl.rollout import RolloutEngine
from agentrl.run.settings import rollout_settings
from agentrl.types import Batch

pytestmark = pytest.mark.anyio


class HintOrLuckEnv(Environment):
    """One turn; reward 1 when the prompt holds a hint or the task says it is easy."""

    name = "hint_or_luck"

    async def reset(self, task: dict[str, Any]) -> list[Message]:
        self.win = "Hint:" in task["question"] or bool(task.get("easy"))
        return [{"role": "user", "content": task["question"]}]

    async def step(self, turn: AssistantTurn) -> StepResult:
        return StepResult(outcome=1.0 if self.win else 0.0, done=True)


def _engine(sampler, renderer, tasks, hooks):
    cfg = RolloutConfig(group_size=3, concurrency=8, max_tokens=200, group_hooks=hooks)
    return RolloutEngine(
        HintOrLuckEnv(),
        sampler,
        renderer,
        rollout_settings(Config(rollout=cfg, sampler=SamplerConfig(max_new_tokens=4))),
        tasks=tasks,
    )


async def test_ghpo_hint_resamples_an_all_fail_group_with_a_hint(sampler, renderer):
    tasks = [
        {"id": "a", "question": "2 + 2?", "solution": "2 + 2 = 4, so 4"},
        {"id": "b", "question": "3 + 3?"},  # no solution: left alone
    ]
    hooks = [{"name": "ghpo_hint", "options": {"fraction": 0.5}}]
    groups = await _engine(sampler, renderer, tasks, hooks).collect(2)
    by_id = {g.task_id: g for g in groups}
    hinted = by_id["a"]
    assert hinted.rewards == [1.0, 1.0, 1.0]
    assert hinted.metadata["group_hooks"] == ["ghpo_hint"]
    for t in hinted.trajectories:
        assert t.metadata["group_hook"] == "ghpo_hint" and t.metadata["hint"] == "2 + 2 = "
        assert t.group_id == hinted.group_id
    assert len({t.traj_id for t in hinted.trajectories}) == 3
    assert by_id["b"].rewards == [0.0, 0.0, 0.0] and "group_hooks" not in by_id["b"].metadata
    Batch.from_groups(groups)  # trainable as they are


async def test_replay_puts_a_stored_success_into_a_later_all_fail_group(sampler, renderer):
    tasks = [
        {"id": "a", "question": "2 + 2?", "easy": True},
        {"id": "a", "question": "2 + 2?"},
    ]
    engine = _engine(sampler, renderer, tasks, ["replay"])
    engine.config = dataclasses.replace(
        engine.config, concurrency=1
    )  # in order: the success is stored before the failure
    first = await engine.run_task(tasks[0], 0)
    second = await engine.run_task(tasks[1], 1)
    assert first.rewards == [1.0] * 3 and "group_hooks" not in first.metadata
    assert sorted(second.rewards) == [0.0, 0.0, 1.0]
    (replayed,) = [t for t in second.trajectories if t.reward == 1.0]
    assert replayed.metadata["group_hook"] == "replay"
    assert replayed.metadata["replayed_from"] in {t.traj_id for t in first.trajectories}
    assert replayed.group_id == second.group_id


def test_bad_hooks_fail_at_construction(sampler, renderer):
    with pytest.raises(UnknownNameError, match="ghpo_hint"):
        _engine(sampler, renderer, [], ["ghpo_hnit"])
    with pytest.raises(ConfigError, match=r"group_hooks\[0\].*unknown option 'fractoin'"):
        _engine(sampler, renderer, [], [{"name": "ghpo_hint", "options": {"fractoin": 1}}])
