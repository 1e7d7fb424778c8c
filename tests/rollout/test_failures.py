"""Infrastructure failures end an episode as infra_error while the run continues;
cancellation closes every environment and leaves no process behind."""

from __future__ import annotations

import time

import anyio
import pytest

from agentrl.config import Config, RolloutConfig, SamplerConfig
from agentrl.rollout import JsonlSink, RolloutEngine
from agentrl.rollout.sinks import read_groups
from agentrl.run.settings import rollout_settings
from agentrl.types import TrajectoryGroup
from tests.procs import live_descendants

from .scripted import (
    HangingToolEnv,
    ProcessSessionEnv,
    RaisingEnv,
    SandboxPythonEnv,
    ScriptedToolEnv,
)

pytestmark = pytest.mark.anyio


def _engine(env, sampler, renderer, tasks, **rollout):
    cfg = RolloutConfig(**{"group_size": 2, "concurrency": 8, "max_tokens": 300, **rollout})
    return RolloutEngine(
        env,
        sampler,
        renderer,
        rollout_settings(Config(rollout=cfg, sampler=SamplerConfig(max_new_tokens=8))),
        tasks=tasks,
    )


def _tasks(n, extra=lambda i: {}):
    return [{"id": f"t{i}", "question": f"Compute {i} + 1.", **extra(i)} for i in range(n)]


async def test_env_that_raises_is_infra_error_after_retries(sampler, renderer):
    RaisingEnv.attempts = 0
    env = RaisingEnv(tool_turns=2, fail_turn=2)
    engine = _engine(env, sampler, renderer, _tasks(2, extra=lambda i: {}), infra_retries=2)
    groups = await engine.collect(2)
    trajs = [t for g in groups for t in g.trajectories]
    assert len(trajs) == 4
    for t in trajs:
        assert t.status == "infra_error"
        assert "database connection lost" in t.error
        assert t.metadata["attempts"] == 3 and len(t.metadata["retried_errors"]) == 3
        assert t.reward == 0.0
        assert len(t.turns) == 2  # the partial trace of the last attempt is kept
    assert RaisingEnv.attempts == 4 * 3
    assert ScriptedToolEnv.open_instances == set()


async def test_hanging_tool_times_out_and_the_run_continues(sampler, renderer):
    class HangOnOdd(HangingToolEnv):
        async def reset(self, task):
            self.hang = task["hang"]
            return await super().reset(task)

        async def step(self, turn):
            if self.hang:
                return await super().step(turn)
            return await ScriptedToolEnv.step(self, turn)

    env = HangOnOdd(tool_turns=1)
    tasks = _tasks(4, extra=lambda i: {"hang": i % 2 == 1})
    engine = _engine(env, sampler, renderer, tasks, episode_timeout_s=1.5, infra_retries=0)
    # allow-clock: episode_timeout_s is itself a time limit: hung episodes end by it (20x)
    t0 = time.perf_counter()
    groups = await engine.collect(4)
    assert time.perf_counter() - t0 < 30  # allow-clock: the same limit
    by_task = {g.task_id: g for g in groups}
    for i in range(4):
        for t in by_task[f"t{i}"].trajectories:
            if i % 2:
                assert t.status == "infra_error" and "timed out" in t.error
            else:
                assert t.status == "ok"
    assert engine.cursor.state_dict() == {"next_index": 4, "reissue": []}
    assert ScriptedToolEnv.open_instances == set()


async def test_sandbox_that_dies_is_infra_error_and_leaves_no_process(sampler, renderer):
    env = SandboxPythonEnv(tool_turns=3)
    tasks = _tasks(4, extra=lambda i: {"die": i % 2 == 1})
    engine = _engine(env, sampler, renderer, tasks, infra_retries=1)
    groups = await engine.collect(4)
    by_task = {g.task_id: g for g in groups}
    for i in range(4):
        for t in by_task[f"t{i}"].trajectories:
            if i % 2:
                assert t.status == "infra_error" and "sandbox failed" in t.error
                assert t.metadata["attempts"] == 2
                assert t.turns[-1].tool_calls[0].infra_error
            else:
                assert t.status == "ok", t.error
                # the python session kept its state across the episode's calls
                outputs = [c.result for turn in t.turns for c in turn.tool_calls]
                assert outputs == ["1", "2", "3"]
    assert live_descendants() == set()


async def test_cancellation_closes_everything_and_leaves_no_process(sampler, renderer, tmp_path):
    ProcessSessionEnv.pids.clear()
    env = ProcessSessionEnv(tool_turns=3, tool_delay_s=0.2)
    engine = _engine(env, sampler, renderer, None, group_size=4, concurrency=16)
    send, receive = anyio.create_memory_object_stream[TrajectoryGroup](1)
    received: list[TrajectoryGroup] = []
    async with JsonlSink(tmp_path / "t.jsonl") as sink, anyio.create_task_group() as tg:
        tg.start_soon(engine.produce, None, send)
        async with receive:
            async for group in receive:
                await sink(group)
                received.append(group)
                if len(received) == 2:
                    assert ScriptedToolEnv.open_instances  # episodes were still in flight
                    tg.cancel_scope.cancel()
                    break
    assert len(ProcessSessionEnv.pids) > 8
    assert ScriptedToolEnv.open_instances == set()
    assert live_descendants() == set()
    assert engine.cursor.in_flight  # cancelled groups stay in flight: a resume re-runs them
    groups = read_groups(tmp_path / "t.jsonl")
    assert [g.group_id for g in groups] == [g.group_id for g in received]
