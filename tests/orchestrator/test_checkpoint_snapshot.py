"""A checkpoint is one instant of the run: written every step while many rollouts are in
flight, each one accounts for every task handed out exactly once (trained, dropped,
buffered or re-issued), and resuming from one neither loses nor repeats a group."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentrl.config import load_config
from agentrl.run.events import BatchTrained, CheckpointSaved, GroupDropped
from agentrl.run.orchestrator import Orchestrator
from agentrl.run.plotting import read_steps
from tests.orchestrator.test_train import BASE

# async, so rollouts keep finishing (and being buffered) while a checkpoint is taken
SETS = [
    *BASE,
    "env.name=tests.orchestrator.parity_env:LaggingParityEnv",
    "rollout.group_size=2",
    "rollout.concurrency=32",
    "learner.batch_groups=2",
    "orchestrator.max_staleness=2",
    "orchestrator.checkpoint_every=1",
]
STEPS = 8
COPY_AT = 3  # the checkpoint a second run resumes from
MORE = 3  # steps the resumed run trains


class Ledger:
    """What the run did with each task index, in event order, and each checkpoint's state."""

    def __init__(self, copy_to: Path | None = None) -> None:
        self.trained: dict[int, list[int]] = {}  # step -> task indices
        self.dropped: list[int] = []
        self.checkpoints: list[tuple[dict[str, Any], int]] = []  # (loop state, drops so far)
        self.copy_to = copy_to

    def __call__(self, event: Any) -> None:
        if isinstance(event, GroupDropped):  # on admission, or evicted once stale
            self.dropped.append(event.task_index)
        elif isinstance(event, BatchTrained):
            self.trained[event.step] = list(event.task_indices)
        elif isinstance(event, CheckpointSaved):
            state = json.loads((Path(event.path) / "orchestrator.json").read_text())
            self.checkpoints.append((state, len(self.dropped)))
            if self.copy_to is not None and event.step == COPY_AT:
                run_dir = Path(event.path).parents[1]
                shutil.copytree(run_dir, self.copy_to)


def _train(run_dir: Path, ledger: Ledger, max_steps: int, resume: bool = False) -> Orchestrator:
    cfg = load_config(overrides=[*SETS, f"orchestrator.max_steps={max_steps}"])
    orch = Orchestrator(cfg, run_dir, resume=resume)
    orch.build()
    orch.events.subscribe(ledger)
    anyio.run(orch.run)
    return orch


def _unaccounted(state: dict[str, Any], handled: list[int]) -> tuple[list[int], list[int]]:
    """(lost, repeated) task indices of a checkpoint: every index handed out must be exactly
    once among `handled` (trained or dropped before it), its buffered groups and its
    re-issued tasks."""
    buffered = [int(g["metadata"]["task_index"]) for g in state["buffer"]["groups"]]
    seen = Counter([*handled, *buffered, *state["cursor"]["reissue"]])
    handed_out = range(state["cursor"]["next_index"])
    lost = [i for i in handed_out if seen[i] == 0]
    repeated = sorted(i for i, n in seen.items() if n > 1 or i not in handed_out)
    return lost, repeated


def _trained_upto(ledger: Ledger, step: int) -> list[int]:
    return [i for s, idx in ledger.trained.items() if s <= step for i in idx]


@pytest.mark.slow  # many checkpointed steps under 32 concurrent rollouts: a stress run
def test_every_checkpoint_accounts_for_each_group_once_and_resumes_without_loss(tmp_path):
    first = Ledger(copy_to=tmp_path / "copy")
    _train(tmp_path / "run", first, STEPS)
    assert [s["step"] for s, _ in first.checkpoints] == list(range(1, STEPS + 1))
    in_flight = 0
    for state, drops in first.checkpoints:
        handled = _trained_upto(first, state["step"]) + first.dropped[:drops]
        lost, repeated = _unaccounted(state, handled)
        assert not lost and not repeated, f"step {state['step']}: lost {lost}, twice {repeated}"
        in_flight += bool(state["cursor"]["reissue"]) and bool(state["buffer"]["groups"])
    # taken with rollouts running and groups waiting (LaggingParityEnv): not quiet points
    assert in_flight >= STEPS // 2

    # resume the copy of checkpoint COPY_AT: what it trains continues the first run's record
    second = Ledger()
    orch = _train(tmp_path / "copy", second, COPY_AT + MORE, resume=True)
    # the step count, the version and the metrics log go on from the checkpoint
    assert orch.learner.version == COPY_AT + MORE
    assert [s["step"] for s in read_steps(tmp_path / "copy")] == list(range(1, COPY_AT + MORE + 1))
    assert orch.step == COPY_AT + MORE and sorted(second.trained) == list(
        range(COPY_AT + 1, COPY_AT + MORE + 1)
    )
    state_at, drops_at = next((s, d) for s, d in first.checkpoints if s["step"] == COPY_AT)
    before = _trained_upto(first, COPY_AT) + first.dropped[:drops_at]
    after = _trained_upto(second, COPY_AT + MORE)
    assert not set(before) & set(after), "a resumed run trained a group again"
    buffered_at = [int(g["metadata"]["task_index"]) for g in state_at["buffer"]["groups"]]
    assert set(buffered_at) <= set(after)  # the restored groups are trained, first
    final, drops = second.checkpoints[-1]
    lost, repeated = _unaccounted(final, before + after + second.dropped[:drops])
    assert not lost and not repeated, f"after resume: lost {lost}, twice {repeated}"
