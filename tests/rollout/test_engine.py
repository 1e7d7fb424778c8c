"""The engine: N groups then stop, bounded streams with backpressure, the data cursor."""

from __future__ import annotations

from typing import ClassVar

import anyio
import pytest

from agentrl.config import RolloutConfig, SamplerConfig
from agentrl.rollout import JsonlSink, RolloutEngine
from agentrl.types import TrajectoryGroup, read_jsonl_groups

from .scripted import ScriptedToolEnv

pytestmark = pytest.mark.anyio


class CountingEnv(ScriptedToolEnv):
    """Remembers the largest number of episodes that were open at once."""

    peak: ClassVar[int] = 0

    async def reset(self, task):
        messages = await super().reset(task)
        CountingEnv.peak = max(CountingEnv.peak, len(ScriptedToolEnv.open_instances))
        return messages


def _engine(env, sampler, renderer, tasks=None, **rollout):
    cfg = RolloutConfig(**{"group_size": 2, "concurrency": 8, "max_tokens": 300, **rollout})
    return RolloutEngine(
        env, sampler, renderer, cfg, sampler_cfg=SamplerConfig(max_new_tokens=6), tasks=tasks
    )


async def test_produce_n_groups_to_a_jsonl_sink(sampler, renderer, tmp_path):
    CountingEnv.peak = 0
    env = CountingEnv(tool_turns=1, tool_delay_s=0.1)
    engine = _engine(env, sampler, renderer, group_size=3, concurrency=5)
    async with JsonlSink(tmp_path / "out.jsonl") as sink:
        n = await engine.produce(5, sink)
    assert n == 5 and sink.count == 5
    groups = read_jsonl_groups((tmp_path / "out.jsonl").read_text().splitlines())
    assert len(groups) == 5 and all(len(g.trajectories) == 3 for g in groups)
    assert sorted(g.metadata["task_index"] for g in groups) == [0, 1, 2, 3, 4]
    assert 1 < CountingEnv.peak <= 5  # episodes overlap, never above the concurrency limit
    assert engine.data_cursor == 5 == engine.tasks_started
    again = groups[0].to_dict()
    assert TrajectoryGroup.from_dict(again).to_dict() == again


async def test_data_cursor_resume_skips_consumed_tasks(sampler, renderer):
    tasks = [{"id": f"t{i}", "question": f"Compute {i}."} for i in range(10)]
    env = ScriptedToolEnv(tool_turns=0)
    first = _engine(env, sampler, renderer, tasks)
    done = await first.collect(4)
    assert sorted(g.task_id for g in done) == ["t0", "t1", "t2", "t3"]
    assert first.data_cursor == 4

    resumed = _engine(env, sampler, renderer)
    resumed.set_tasks(tasks, cursor=first.data_cursor)
    more = await resumed.collect(3)
    assert sorted(g.task_id for g in more) == ["t4", "t5", "t6"]
    assert resumed.data_cursor == 7
    rest = await resumed.collect(100)  # the tasks run out: fewer groups, no error
    assert sorted(g.task_id for g in rest) == ["t7", "t8", "t9"]
    with pytest.raises(ValueError, match="cursor must be >= 0"):
        resumed.set_tasks(tasks, cursor=-1)


async def test_run_forever_is_backpressured_by_a_bounded_stream(sampler, renderer):
    env = ScriptedToolEnv(tool_turns=0)
    engine = _engine(env, sampler, renderer, group_size=2, concurrency=4)
    send, receive = anyio.create_memory_object_stream[TrajectoryGroup](1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.run_forever, send)
        await anyio.sleep(3.0)  # nobody reads: the engine must stop taking tasks
        stalled = engine.tasks_started
        assert stalled <= engine.max_groups_in_flight + 1
        await anyio.sleep(1.0)
        assert engine.tasks_started == stalled
        got = [await receive.receive() for _ in range(6)]  # reading lets it go on
        assert engine.tasks_started > stalled
        tg.cancel_scope.cancel()
    assert len({g.group_id for g in got}) == 6
    assert ScriptedToolEnv.open_instances == set()


async def test_bad_sink_is_a_clear_error(sampler, renderer):
    engine = _engine(ScriptedToolEnv(), sampler, renderer)
    with pytest.raises(TypeError, match="sink must be an async callable"):
        await engine.produce(1, 42)  # type: ignore[arg-type]
