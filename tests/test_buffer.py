"""Buffer: staleness gate, dynamic sampling, infra masking, backpressure, checkpoints."""

from __future__ import annotations

import json

import anyio
import pytest

from agentrl.algos import dynamic_sampling_mask
from agentrl.run.buffer import Admission, Buffer, BufferClosedError
from agentrl.types import Segment, Trajectory, TrajectoryGroup
from tests.waiting import wait_until_async


def make_group(
    rewards: list[float],
    version: int = 0,
    statuses: list[str] | None = None,
    task_id: str = "t",
    versions: list[int] | None = None,
) -> TrajectoryGroup:
    statuses = statuses or ["ok"] * len(rewards)
    trajs = []
    for i, (r, s) in enumerate(zip(rewards, statuses, strict=True)):
        v = versions[i] if versions is not None else version
        trajs.append(
            Trajectory(
                segments=[
                    Segment("prompt", [1, 2, 3]),
                    Segment("model", [4, 5], logprobs=[-1.0, -2.0], versions=[v, v + 1]),
                ],
                reward=r,
                status=s,  # type: ignore[arg-type]
                task_id=task_id,
                traj_id=f"{task_id}-{i}",
            )
        )
    return TrajectoryGroup(task_id=task_id, trajectories=trajs, group_id=task_id)


def test_staleness_gate_on_admission_and_release() -> None:
    async def main() -> None:
        evicted: list[TrajectoryGroup] = []
        buf = Buffer(max_staleness=1, capacity=8, learner_version=3, on_evict=evicted.extend)
        assert await buf.put(make_group([0.0, 1.0], version=2, task_id="fresh"))
        assert await buf.put(make_group([0.0, 1.0], version=3, task_id="newest"))
        # oldest token at version 1: 3 - 1 = 2 > 1
        assert not await buf.put(make_group([0.0, 1.0], version=1, task_id="old"))
        assert buf.counters["dropped_stale"] == 1
        assert buf.counters["admitted"] == 2
        # the learner advanced to 4: the version-2 group is now stale and is evicted
        batch = await buf.get_batch(1, learner_version=4)
        assert [g.task_id for g in batch] == ["newest"]
        assert buf.counters["dropped_stale_in_buffer"] == 1
        assert [g.task_id for g in evicted] == ["fresh"]  # handed over for a replacement
        assert buf.counters["released"] == 1
        assert len(buf) == 0

    anyio.run(main)


def test_staleness_uses_oldest_token_of_valid_samples() -> None:
    buf = Buffer(max_staleness=0, learner_version=5)
    g = make_group([0.0, 1.0, 1.0], versions=[5, 4, 5])
    assert buf.staleness(g) == 1
    assert buf.check(g) == "dropped_stale"
    # the stale sample failed for infra reasons: it does not count
    g2 = make_group([0.0, 1.0, 1.0], versions=[5, 4, 5], statuses=["ok", "infra_error", "ok"])
    assert buf.staleness(g2) == 0
    assert buf.check(g2) is None


def test_no_gate_when_max_staleness_none() -> None:
    buf = Buffer(max_staleness=None, learner_version=100)
    assert buf.check(make_group([0.0, 1.0], version=0)) is None


def test_dynamic_sampling_and_infra_counts() -> None:
    async def main() -> None:
        buf = Buffer(max_staleness=2, dynamic_sampling=True)
        assert not await buf.put(make_group([1.0, 1.0, 1.0]))
        assert not await buf.put(make_group([0.0, 0.0]))
        # all-equal among the valid ones only (the infra sample's reward is ignored)
        assert not await buf.put(make_group([1.0, 0.0, 1.0], statuses=["ok", "infra_error", "ok"]))
        assert buf.counters["dropped_all_equal"] == 3
        # one valid sample left: no baseline
        assert not await buf.put(make_group([1.0, 0.0], statuses=["ok", "infra_error"]))
        assert buf.counters["dropped_infra"] == 1
        # admitted with one masked infra sample kept in the group
        assert await buf.put(
            make_group([1.0, 0.0, 0.5], statuses=["ok", "ok", "infra_error"], task_id="m")
        )
        assert buf.counters["masked_infra_trajectories"] == 1
        assert buf.counters["received"] == 5
        assert buf.counters["admitted"] == 1
        [g] = await buf.get_batch(1, learner_version=0)
        assert len(g.trajectories) == 3 and len(g.valid()) == 2

    anyio.run(main)


def test_put_says_what_happened_to_the_group() -> None:
    async def main() -> None:
        buf = Buffer(max_staleness=0, dynamic_sampling=True, learner_version=1)
        infra = make_group([1.0, 0.0], version=1, statuses=["ok", "infra_error"])
        assert await buf.put(infra) == Admission("dropped_infra")
        assert await buf.put(make_group([1.0, 1.0], version=1)) == Admission("dropped_all_equal")
        stale = await buf.put(make_group([0.0, 1.0], version=0))
        assert not stale and not stale.admitted and stale.reason == "dropped_stale"
        ok = await buf.put(make_group([0.0, 1.0], version=1))
        assert ok and ok.admitted and ok.reason is None
        assert buf.counters["received"] == 4 and buf.counters["admitted"] == 1

    anyio.run(main)


def test_put_reports_a_group_that_went_stale_while_waiting_for_room() -> None:
    async def main() -> None:
        buf = Buffer(max_staleness=0, capacity=1, learner_version=0)
        assert await buf.put(make_group([0.0, 1.0], version=0, task_id="first"))
        results: list[Admission] = []

        async def producer() -> None:
            results.append(await buf.put(make_group([0.0, 1.0], version=0, task_id="late")))

        async with anyio.create_task_group() as tg:
            tg.start_soon(producer)
            await wait_until_async(lambda: buf.waiting_tasks == 1, "the producer waiting for room")
            # the learner moves on: "first" is evicted, which frees the room "late" waited
            # for, but "late" is stale by now too
            await buf.set_learner_version(1)
        assert results == [Admission("dropped_stale")]
        assert buf.counters["dropped_stale"] == 1 and buf.counters["dropped_stale_in_buffer"] == 1

    anyio.run(main)


@pytest.mark.parametrize(
    ("rewards", "statuses", "kept"),
    [
        ([1.0, 1.0, 1.0], None, False),
        ([0.0, 1.0], None, True),
        ([0.3, 0.1 + 0.2], None, True),  # differ in float64 only: float32 would call them equal
        ([0.5, 0.5 + 1e-12, 0.5], None, True),
        ([2.0, 2.0, 2.0 + 2**-40], None, True),
        ([1.0, 0.0, 1.0], ["ok", "infra_error", "ok"], False),  # the infra sample does not count
        ([0.7, float("nan"), 0.2], ["ok", "infra_error", "ok"], True),
        ([1.0, 0.0], ["ok", "infra_error"], False),  # one valid sample: nothing to compare
    ],
)
def test_dynamic_sampling_keeps_exactly_groups_whose_rewards_differ(
    rewards: list[float], statuses: list[str] | None, kept: bool
) -> None:
    """The buffer's keep/drop decisions, and DAPO's mask in agentrl.algos, each against the
    expected answer written out by hand."""
    import torch

    group = make_group(rewards, statuses=statuses)
    buf = Buffer(max_staleness=None, dynamic_sampling=True, min_valid=1)
    assert buf.check(group) == (None if kept else "dropped_all_equal")
    valid = torch.tensor([s != "infra_error" for s in statuses or ["ok"] * len(rewards)])
    keep = dynamic_sampling_mask(
        torch.tensor(rewards, dtype=torch.float64),
        torch.zeros(len(rewards), dtype=torch.long),
        valid,
    )
    assert keep.tolist() == [kept] * len(rewards)


def test_dynamic_sampling_off_keeps_all_equal_groups() -> None:
    async def main() -> None:
        buf = Buffer(max_staleness=1, dynamic_sampling=False)
        assert await buf.put(make_group([1.0, 1.0]))
        assert buf.counters["dropped_all_equal"] == 0

    anyio.run(main)


def test_get_batch_waits_and_backpressure() -> None:
    async def main() -> None:
        buf = Buffer(max_staleness=None, capacity=2)
        order: list[str] = []

        async def producer() -> None:
            for i in range(5):
                await buf.put(make_group([0.0, 1.0], task_id=f"g{i}"))
                order.append(f"put{i}")

        got: list[str] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(producer)
            await wait_until_async(lambda: buf.waiting_tasks == 1, "the producer waiting for room")
            # capacity 2: the producer is blocked on the third put
            assert len(buf) == 2 and order == ["put0", "put1"]
            for _ in range(2):
                batch = await buf.get_batch(2, learner_version=0)
                got += [g.task_id for g in batch]
            batch = await buf.get_batch(1, learner_version=0)
            got += [g.task_id for g in batch]
        assert got == ["g0", "g1", "g2", "g3", "g4"]

    anyio.run(main)


def test_eviction_unblocks_waiting_producer() -> None:
    async def main() -> None:
        buf = Buffer(max_staleness=0, capacity=1)
        await buf.put(make_group([0.0, 1.0], version=0, task_id="old"))
        done = anyio.Event()

        async def producer() -> None:
            await buf.put(make_group([0.0, 1.0], version=1, task_id="new"))
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(producer)
            await wait_until_async(lambda: buf.waiting_tasks == 1, "the producer waiting for room")
            assert not done.is_set()
            with anyio.fail_after(2):
                [g] = await buf.get_batch(1, learner_version=1)
        assert g.task_id == "new"
        assert buf.counters["dropped_stale_in_buffer"] == 1

    anyio.run(main)


def test_close_wakes_get_batch() -> None:
    async def main() -> None:
        buf = Buffer(max_staleness=None)
        await buf.put(make_group([0.0, 1.0]))

        async def closer() -> None:
            await wait_until_async(lambda: buf.waiting_tasks == 1, "get_batch waiting")
            await buf.close()

        async with anyio.create_task_group() as tg:
            tg.start_soon(closer)
            with pytest.raises(BufferClosedError, match="1 groups, 2 requested"):
                await buf.get_batch(2, learner_version=0)

    anyio.run(main)


def test_bad_arguments_name_the_value() -> None:
    with pytest.raises(ValueError, match=r"max_staleness must be >= 0.*-1"):
        Buffer(max_staleness=-1)

    async def main() -> None:
        buf = Buffer(capacity=2)
        with pytest.raises(ValueError, match=r"n_groups \(3\) exceeds the buffer capacity"):
            await buf.get_batch(3, learner_version=0)

    anyio.run(main)


def test_state_dict_roundtrip_is_json() -> None:
    async def main() -> None:
        buf = Buffer(max_staleness=1, learner_version=2)
        await buf.put(make_group([0.0, 1.0], version=2, task_id="a"))
        await buf.put(make_group([1.0, 0.5], version=1, task_id="b"))
        await buf.put(make_group([0.0, 1.0], version=0, task_id="stale"))
        state = json.loads(json.dumps(buf.state_dict()))
        restored = Buffer(max_staleness=1)
        restored.load_state_dict(state)
        assert len(restored) == 2
        assert restored.learner_version == 2
        assert restored.counters == buf.counters
        batch = await restored.get_batch(2, learner_version=2)
        assert [g.task_id for g in batch] == ["a", "b"]
        assert batch[1].trajectories[0].behavior_logprobs == [0.0, 0.0, 0.0, -1.0, -2.0]

    anyio.run(main)


def test_dynamic_sampling_gives_up_with_a_message_naming_the_cause(caplog):
    from agentrl.errors import TrainingStalledError

    buf = Buffer(dynamic_sampling=True, max_dropped=4)

    async def main() -> None:
        for i in range(3):
            assert (await buf.put(make_group([0.0, 0.0], task_id=f"t{i}"))).reason == (
                "dropped_all_equal"
            )
        assert "2 groups in a row had all rewards equal" in caplog.text  # warned half way
        await buf.put(make_group([1.0, 0.0], task_id="mixed"))  # a signal resets the count
        for i in range(3):
            await buf.put(make_group([1.0, 1.0], task_id=f"u{i}"))
        with pytest.raises(TrainingStalledError, match=r"4 groups in a row.*dynamic_sampling"):
            await buf.put(make_group([1.0, 1.0], task_id="last"))

    anyio.run(main)


def test_dynamic_sampling_can_train_on_what_there_is():
    buf = Buffer(dynamic_sampling=True, max_dropped=2, on_max_dropped="train", capacity=8)

    async def main() -> None:
        assert not await buf.put(make_group([0.0, 0.0], task_id="a"))
        assert await buf.put(make_group([0.0, 0.0], task_id="b"))  # the bound: admitted
        assert await buf.put(make_group([0.0, 0.0], task_id="c"))  # and so on, until a signal
        assert await buf.put(make_group([1.0, 0.0], task_id="d"))
        assert not await buf.put(make_group([0.0, 0.0], task_id="e"))  # waiting again

    anyio.run(main)
    assert buf.counters["admitted_all_equal"] == 2 and buf.counters["dropped_all_equal"] == 2


@pytest.mark.parametrize(
    ("rewards", "reason"),
    [
        # unbiased std by hand: [0, 1] -> 0.7071; [0, 0, 0, 1] -> sqrt(0.75 / 3) = 0.5;
        # [0.5, 0.6] -> 0.0707; [0, 0, 0, 0, 0, 0, 0, 1] -> sqrt(0.875 / 7) = 0.3536
        ([0.0, 1.0], None),
        ([0.0, 0.0, 0.0, 1.0], None),
        ([0.5, 0.6], "dropped_low_std"),
        ([0.0] * 7 + [1.0], "dropped_low_std"),
        ([1.0, 1.0], "dropped_all_equal"),  # still counted as all-equal
    ],
)
def test_min_group_reward_std_drops_groups_below_it(rewards, reason) -> None:
    import torch

    buf = Buffer(max_staleness=None, dynamic_sampling=True, min_reward_std=0.4)
    assert buf.check(make_group(rewards)) == reason
    keep = dynamic_sampling_mask(
        torch.tensor(rewards, dtype=torch.float64),
        torch.zeros(len(rewards), dtype=torch.long),
        min_std=0.4,
    )
    assert keep.tolist() == [reason is None] * len(rewards)


def test_low_std_groups_follow_the_dynamic_sampling_bound(caplog) -> None:
    from agentrl.errors import TrainingStalledError

    buf = Buffer(dynamic_sampling=True, max_dropped=3, min_reward_std=0.4, capacity=8)

    async def main() -> None:
        assert (await buf.put(make_group([0.5, 0.6], task_id="a"))).reason == "dropped_low_std"
        assert (await buf.put(make_group([1.0, 1.0], task_id="b"))).reason == "dropped_all_equal"
        with pytest.raises(TrainingStalledError, match=r"min_group_reward_std=0\.4"):
            await buf.put(make_group([0.5, 0.55], task_id="c"))

    anyio.run(main)
    assert buf.counters["dropped_low_std"] == 1 and buf.counters["dropped_all_equal"] == 1
    forgiving = Buffer(
        dynamic_sampling=True, max_dropped=1, min_reward_std=0.4, on_max_dropped="train"
    )
    assert anyio.run(forgiving.put, make_group([0.5, 0.6]))  # the bound: admitted
    assert forgiving.counters["admitted_low_std"] == 1


def test_min_group_reward_std_needs_dynamic_sampling() -> None:
    from agentrl.config import load_config
    from agentrl.errors import ConfigError
    from agentrl.learner.objective import check_algorithm
    from agentrl.run.settings import objective_settings

    cfg = load_config(None, ["algorithm.min_group_reward_std=0.1"])
    with pytest.raises(ConfigError, match=r"set algorithm\.dynamic_sampling=true"):
        check_algorithm(objective_settings(cfg))
    cfg = load_config(
        None, ["algorithm.min_group_reward_std=0.1", "algorithm.dynamic_sampling=true"]
    )
    assert check_algorithm(objective_settings(cfg)).alg.min_group_reward_std == 0.1


def test_groups_that_only_fail_for_infra_reasons_stop_the_run_naming_the_error() -> None:
    # an agent command that exits at once fails every episode: the run must not draw tasks
    # forever; an admitted group in between starts the count again
    from agentrl.errors import TrainingStalledError

    def failed(k: int) -> TrajectoryGroup:
        g = make_group([0.0, 0.0], statuses=["infra_error"] * 2, task_id=f"f{k}")
        for t in g.trajectories:
            t.error = "agent command exited with 127: codex: not found"
        return g

    buf = Buffer(max_dropped=3)

    async def main() -> None:
        assert (await buf.put(failed(0))).reason == "dropped_infra"
        assert (await buf.put(failed(1))).reason == "dropped_infra"
        assert await buf.put(make_group([1.0, 0.0], task_id="ok"))
        assert (await buf.put(failed(2))).reason == "dropped_infra"
        assert (await buf.put(failed(3))).reason == "dropped_infra"
        with pytest.raises(TrainingStalledError, match=r"3 groups in a row .*codex: not found"):
            await buf.put(failed(4))

    anyio.run(main)
