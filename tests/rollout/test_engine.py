"""The engine: N groups then stop, bounded streams with backpressure, the data cursor."""

from __future__ import annotations

from typing import ClassVar

import anyio
import anyio.lowlevel
import pytest

from agentrl.config import Config, RolloutConfig, SamplerConfig
from agentrl.rollout import JsonlSink, RolloutEngine
from agentrl.rollout.sinks import read_groups
from agentrl.run.settings import rollout_settings
from agentrl.types import TrajectoryGroup
from tests.waiting import wait_until_async

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
        env,
        sampler,
        renderer,
        rollout_settings(Config(rollout=cfg, sampler=SamplerConfig(max_new_tokens=6))),
        tasks=tasks,
    )


async def test_produce_n_groups_to_a_jsonl_sink(sampler, renderer, tmp_path):
    CountingEnv.peak = 0
    env = CountingEnv(tool_turns=1, tool_delay_s=0.1)
    engine = _engine(env, sampler, renderer, group_size=3, concurrency=5)
    async with JsonlSink(tmp_path / "out.jsonl") as sink:
        n = await engine.produce(5, sink)
    assert n == 5 and sink.count == 5
    groups = read_groups(tmp_path / "out.jsonl")
    assert len(groups) == 5 and all(len(g.trajectories) == 3 for g in groups)
    assert sorted(g.metadata["task_index"] for g in groups) == [0, 1, 2, 3, 4]
    assert 1 < CountingEnv.peak <= 5  # episodes overlap, never above the concurrency limit
    assert engine.cursor.state_dict() == {"next_index": 5, "reissue": []}
    again = groups[0].to_dict()
    assert TrajectoryGroup.from_dict(again).to_dict() == again


async def test_cursor_resume_skips_consumed_tasks(sampler, renderer):
    tasks = [{"id": f"t{i}", "question": f"Compute {i}."} for i in range(10)]
    env = ScriptedToolEnv(tool_turns=0)
    first = _engine(env, sampler, renderer, tasks)
    done = await first.collect(4)
    assert sorted(g.task_id for g in done) == ["t0", "t1", "t2", "t3"]
    saved = first.cursor.state_dict()
    assert saved == {"next_index": 4, "reissue": []}

    resumed = _engine(env, sampler, renderer, tasks)
    resumed.cursor.load_state_dict(saved)
    more = await resumed.collect(3)
    assert sorted(g.task_id for g in more) == ["t4", "t5", "t6"]
    rest = await resumed.collect(100)  # the tasks run out: fewer groups, no error
    assert sorted(g.task_id for g in rest) == ["t7", "t8", "t9"]


async def test_tasks_in_flight_at_a_checkpoint_are_reissued_first(sampler, renderer):
    tasks = [{"id": f"t{i}", "question": f"Compute {i}."} for i in range(6)]
    engine = _engine(ScriptedToolEnv(tool_turns=0), sampler, renderer, tasks)
    for _ in range(3):
        engine.cursor.take()
    engine.cursor.settle(1)  # t0 and t2 were still running when the checkpoint was written
    resumed = _engine(ScriptedToolEnv(tool_turns=0), sampler, renderer, tasks)
    resumed.cursor.load_state_dict(engine.cursor.state_dict())
    again = await resumed.collect(6)
    assert sorted(g.task_id for g in again) == ["t0", "t2", "t3", "t4", "t5"]


async def test_run_forever_is_backpressured_by_a_bounded_stream(sampler, renderer):
    env = ScriptedToolEnv(tool_turns=0)
    engine = _engine(env, sampler, renderer, group_size=2, concurrency=4)
    send, receive = anyio.create_memory_object_stream[TrajectoryGroup](1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.produce, None, send)
        # nobody reads: the first group fills the stream, the next ones block in emit
        # holding every slot, so the engine takes exactly max_groups_in_flight + 1 tasks
        stalled = engine.max_groups_in_flight + 1
        await wait_until_async(
            lambda: (
                engine.cursor.next_index == stalled and send.statistics().current_buffer_used == 1
            ),
            "the engine filling its slots and the stream",
        )
        for _ in range(200):  # the loop runs everything else that is ready: nothing is taken
            await anyio.lowlevel.checkpoint()
        assert engine.cursor.next_index == stalled
        got = [await receive.receive() for _ in range(6)]  # reading lets it go on
        assert engine.cursor.next_index > stalled
        tg.cancel_scope.cancel()
    assert len({g.group_id for g in got}) == 6
    assert ScriptedToolEnv.open_instances == set()


async def test_bad_sink_is_a_clear_error(sampler, renderer):
    engine = _engine(ScriptedToolEnv(), sampler, renderer)
    with pytest.raises(TypeError, match="sink must be an async callable"):
        await engine.produce(1, 42)  # type: ignore[arg-type]
