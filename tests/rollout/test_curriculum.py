"""The learnability curriculum: running success rates by hand, the share of each task the
cursor issues, the same choices after a resume, and an orchestrator run that uses it."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from agentrl.config import load_config
from agentrl.rollout.curriculum import Curriculum
from agentrl.rollout.tasks import TaskCursor
from agentrl.run.orchestrator import Orchestrator
from agentrl.run.plotting import read_steps
from agentrl.types import Segment, Trajectory, TrajectoryGroup

TASKS = [{"id": "easy"}, {"id": "mid"}, {"id": "hard"}, {"id": "new"}]


def group(task_id: str, rewards: list[float]) -> TrajectoryGroup:
    trajs = [
        Trajectory(segments=[Segment("prompt", [1])], reward=r, task_id=task_id, traj_id=str(i))
        for i, r in enumerate(rewards)
    ]
    return TrajectoryGroup(task_id=task_id, trajectories=trajs, group_id=task_id)


def curriculum() -> Curriculum:
    c = Curriculum(min_weight=0.1, seed=3)
    c.observe(group("easy", [1.0, 1.0, 1.0, 1.0]))  # p = 1
    c.observe(group("mid", [1.0, 1.0, 1.0, 1.0]))
    c.observe(group("mid", [0.0, 0.0, 0.0, 0.0]))  # EMA 0.5: p = 0.5 * 1 + 0.5 * 0 = 0.5
    c.observe(group("hard", [0.0, 0.0, 0.5, 0.0]))  # p = 0.125
    return c


def test_weights_from_running_success_rates() -> None:
    c = curriculum()
    assert c.success == {"easy": 1.0, "mid": 0.5, "hard": 0.125}
    assert c.weight("easy") == 0.1  # 4 p (1 - p) = 0: the floor
    assert c.weight("mid") == 1.0
    assert c.weight("hard") == pytest.approx(4 * 0.125 * 0.875)  # 0.4375
    assert c.weight("new") == 1.0  # never seen
    c.observe(group("hard", [2.0, -1.0]))  # rewards clipped to [0, 1]: rate 0.5
    assert c.success["hard"] == pytest.approx(0.5 * 0.125 + 0.5 * 0.5)


def test_the_cursor_issues_each_task_by_its_weight() -> None:
    c = curriculum()
    cursor = TaskCursor.over(TASKS, epochs=None)
    cursor.keep = c.keep
    issued: dict[str, int] = dict.fromkeys(("easy", "mid", "hard", "new"), 0)
    for _ in range(2000):
        taken = cursor.take()
        assert taken is not None
        issued[taken[1]["id"]] += 1
        cursor.settle(taken[0])
    offered = dict.fromkeys(issued, 0)  # each task's turns in the stream so far
    for i in range(cursor.next_index):
        offered[TASKS[i % 4]["id"]] += 1
    share = {k: v / offered[k] for k, v in issued.items()}
    assert share["mid"] == 1.0 and share["new"] == 1.0
    assert 0.06 < share["easy"] < 0.14
    assert 0.38 < share["hard"] < 0.50
    assert c.metrics()["curriculum/skipped"] == cursor.next_index - 2000


def test_a_resumed_cursor_makes_the_same_choices() -> None:
    def run(n: int, cursor: TaskCursor) -> list[int]:
        out = []
        for _ in range(n):
            taken = cursor.take()
            assert taken is not None
            out.append(taken[0])
            cursor.settle(taken[0])
        return out

    c1 = curriculum()
    a = TaskCursor.over(TASKS, epochs=None)
    a.keep = c1.keep
    first = run(50, a)
    state, stats = a.state_dict(), c1.state_dict()
    rest = run(50, a)
    c2 = Curriculum(min_weight=0.1, seed=3)
    c2.load_state_dict(json.loads(json.dumps(stats)))  # through a JSON checkpoint
    b = TaskCursor.over(TASKS, epochs=None)
    b.keep = c2.keep
    b.load_state_dict(state)
    assert run(50, b) == rest and first[-1] < rest[0]


def test_a_training_run_tracks_its_tasks(tmp_path: Path) -> None:
    cfg = load_config(
        overrides=[
            "model.name=tiny-llama",
            "model.dtype=float32",
            "env.name=tests.orchestrator.parity_env:RecurringParityEnv",
            "env.options.size=3",
            "sampler.max_new_tokens=2",
            "rollout.group_size=4",
            "rollout.max_turns=1",
            "rollout.max_tokens=64",
            "learner.batch_groups=2",
            "learner.micro_batch_size=8",
            "orchestrator.max_steps=3",
            "orchestrator.max_staleness=0",
            "orchestrator.checkpoint_every=0",
            "orchestrator.curriculum=learnability",
            "logging.progress=false",
        ]
    )
    orch = Orchestrator(cfg, tmp_path / "run", resume=False)
    orch.build()
    anyio.run(orch.run)
    assert orch.curriculum is not None
    assert set(orch.curriculum.success) <= {"train-0", "train-1", "train-2"}
    assert len(orch.curriculum.success) >= 2
    last = read_steps(tmp_path / "run")[-1]
    assert last["curriculum/tasks"] == len(orch.curriculum.success)
    assert "curriculum" in orch.snapshot()
