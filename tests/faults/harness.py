"""Fault scenarios' shared parts: start a real training run on the tiny model, hurt it, and
audit what it left behind.

The audit reads only what a run writes (``metrics.jsonl``, the checkpoints) and checks:

* steps: the lineage of the final weights (each segment of the run, cut at the step the
  next ``--resume`` started from) trains steps 1..N once each; a step whose checkpoint
  was written and that the lineage lacks is *lost*;
* samples: no task of the stream (by index) and no group (by id) is trained twice in
  that lineage;
* the latest checkpoint loads into the tiny model and agrees with the loop state.

Orphans are counted with ``ps`` by process group: each driver starts in its own session,
so whatever it spawned (the learner child, sandboxes) shares its group id.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.runfolder import LOOP_STATE, latest_checkpoint
from tests import waiting

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 600.0  # a loaded 2-core machine takes minutes to import torch twice
ORPHAN_GRACE_S = 60.0  # processes of a killed driver's group go within seconds when idle

# the tiny model on a one-turn task whose reward needs no tool (tests/orchestrator/test_train)
TINY = [
    "model.name=tiny-llama",
    "model.dtype=float32",
    "env.name=tests.orchestrator.parity_env:ParityEnv",
    "sampler.max_new_tokens=4",
    "sampler.max_batch_size=16",
    "rollout.group_size=4",
    "rollout.concurrency=16",
    "rollout.max_turns=1",
    "rollout.max_tokens=64",
    "learner.batch_groups=2",
    "learner.micro_batch_size=8",
    "learner.lr=1e-3",
    "orchestrator.max_staleness=1",
    "orchestrator.checkpoint_every=1",
    "logging.progress=false",
]


# --- running a driver ------------------------------------------------------------------


def held_marker(run_dir: Path, moment: str) -> Path:
    """The file a driver started with ``hold=moment`` writes when it holds there."""
    return run_dir.parent / f"{run_dir.name}.held-{moment}"


def start_driver(
    run_dir: Path, max_steps: int, *overrides: str, resume: bool = False, hold: str = ""
) -> subprocess.Popen[bytes]:
    """`agentrl train` in its own session (process group = its pid), stderr to a file;
    with `hold`, one that stops at that moment (tests/faults/held_driver.py) and writes
    `held_marker(run_dir, hold)` there."""
    config = run_dir.parent / "faults.yaml"
    if not config.exists():
        config.write_text("{}\n")
    if hold:
        marker = held_marker(run_dir, hold)
        marker.unlink(missing_ok=True)
        args = [sys.executable, "-m", "tests.faults.held_driver", hold, str(marker), "--"]
    else:
        args = [sys.executable, "-m", "agentrl.cli"]
    args += ["train", str(config), "--no-summary"]
    args += ["--resume", str(run_dir)] if resume else ["--run-dir", str(run_dir)]
    for s in [*TINY, f"orchestrator.max_steps={max_steps}", *overrides]:
        args += ["--set", s]
    run_dir.mkdir(parents=True, exist_ok=True)
    log = (run_dir / "driver.log").open("ab")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        return subprocess.Popen(
            args, cwd=REPO, env=env, stdout=log, stderr=log, start_new_session=True
        )
    finally:
        log.close()


def driver_log(run_dir: Path) -> str:
    path = run_dir / "driver.log"
    return path.read_text(errors="replace") if path.exists() else ""


def wait_for(predicate: Any, proc: subprocess.Popen[bytes] | None, what: str) -> bool:
    """Poll `predicate` (an effect the driver leaves in its run folder) until true; False
    when `proc` exits first (then `predicate` is asked once more). Hangs end in an error."""
    exited: list[int] = []

    def gone() -> str | None:
        if proc is not None and proc.poll() is not None:
            exited.append(proc.returncode)
            return f"the driver exited ({proc.returncode})"
        return None

    try:
        waiting.wait_until(predicate, what, timeout=START_TIMEOUT_S, interval=0.02, abort=gone)
    except AssertionError:
        if exited:
            return bool(predicate())
        raise
    return True


def sigkill_group_leader(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the driver alone (not its group): what it spawned must go by itself."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group `pgid`, by ``ps``."""
    out = subprocess.run(
        ["ps", "-eo", "pid=,pgid=,stat="], capture_output=True, text=True, check=True
    ).stdout
    found = []
    for line in out.splitlines():
        pid, group, stat = line.split(None, 2)
        if int(group) == pgid and not stat.startswith("Z"):
            found.append(int(pid))
    return found


def orphans_after(pgid: int, grace_s: float = ORPHAN_GRACE_S) -> list[int]:
    """The group's processes still alive once its leader ended (0 expected): each must go
    by itself, so this waits for the group to empty; `grace_s` only ends the wait for one
    that never goes (an orphan), however slow a loaded machine is."""
    try:
        waiting.wait_until(
            lambda: not group_members(pgid), f"group {pgid} empty", timeout=grace_s, interval=0.1
        )
    except AssertionError:
        pass
    return group_members(pgid)


def kill_orphans(pids: list[int]) -> None:
    """Clean up after a failed check (only processes of a group this test started)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stale_processes(pgid: int) -> int:
    left = orphans_after(pgid)
    kill_orphans(left)
    return len(left)


# --- the audit ----------------------------------------------------------------------------


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by SIGKILL
            continue
    return rows


@dataclass
class Audit:
    final_step: int = 0
    segments: int = 0  # driver starts (1 + resumes)
    lineage: list[int] = field(default_factory=list)  # steps of the final weights, in order
    steps_lost: list[int] = field(default_factory=list)  # checkpointed, then missing
    steps_redone: int = 0  # trained after the last checkpoint and trained again on resume
    samples_trained: int = 0
    trained_twice: int = 0  # task indices or group ids trained more than once
    checkpoint_loadable: bool = False
    checkpoint_error: str = ""
    rows: list[dict[str, Any]] = field(default_factory=list, repr=False)  # lineage steps

    @property
    def steps_ok(self) -> bool:
        return self.lineage == list(range(1, self.final_step + 1))

    def trained_since(self, step: int) -> tuple[set[int], set[str]]:
        """(task indices, group ids) the lineage trained in steps after `step`."""
        later = [r for r in self.rows if r["step"] > step]
        return {i for r in later for i in r["task_indices"]}, {
            g for r in later for g in r["group_ids"]
        }


def audit(run_dir: Path, load_weights: bool = True) -> Audit:
    rows = read_events(run_dir)
    segments: list[dict[str, Any]] = []
    for row in rows:
        if row["event"] == "RunStarted":
            segments.append({"from": int(row["resumed_from_step"]), "trained": [], "saved": []})
        elif segments and row["event"] == "BatchTrained":
            segments[-1]["trained"].append(row)
        elif segments and row["event"] == "CheckpointSaved":
            segments[-1]["saved"].append(int(row["step"]))
    a = Audit(segments=len(segments))
    lineage_rows: list[dict[str, Any]] = []
    for i, seg in enumerate(segments):
        until = segments[i + 1]["from"] if i + 1 < len(segments) else 10**9
        kept = [r for r in seg["trained"] if r["step"] <= until]
        a.steps_redone += len(seg["trained"]) - len(kept)
        lineage_rows += kept
        a.steps_lost += [s for s in seg["saved"] if s > until]
    a.lineage = [int(r["step"]) for r in lineage_rows]
    a.final_step = max(a.lineage, default=0)
    indices = [i for r in lineage_rows for i in r["task_indices"]]
    ids = [g for r in lineage_rows for g in r["group_ids"]]
    a.samples_trained = len(ids)
    a.trained_twice = sum(n - 1 for n in Counter(indices).values() if n > 1) + sum(
        n - 1 for n in Counter(ids).values() if n > 1
    )
    a.rows = lineage_rows
    if load_weights:
        a.checkpoint_loadable, a.checkpoint_error = checkpoint_loads(run_dir, a.final_step)
    return a


def checkpoint_state(run_dir: Path) -> dict[str, Any] | None:
    """The loop state of the run's latest checkpoint (None before the first)."""
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None or not (ckpt / LOOP_STATE).is_file():
        return None
    return json.loads((ckpt / LOOP_STATE).read_text())


def checkpoint_loads(run_dir: Path, step: int) -> tuple[bool, str]:
    """The latest checkpoint is step `step`, its loop state agrees, its weights load."""
    from safetensors.torch import load_model

    from agentrl.models import load_model as load_tiny

    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        return False, "no latest checkpoint"
    try:
        state = json.loads((ckpt / LOOP_STATE).read_text())
        meta = json.loads((ckpt / "learner" / "learner.json").read_text())
        if not state["step"] == state["version"] == meta["version"] == step:
            return False, f"step/version disagree: {state['step']} {state['version']} {meta}"
        model, _ = load_tiny("tiny-llama", dtype="float32")
        load_model(model, str(ckpt / "learner" / "model.safetensors"))
    except Exception as e:  # the check reports, the test asserts
        return False, f"{type(e).__name__}: {e}"
    return True, ""


def run_in_process(run_dir: Path, max_steps: int, *overrides: str, resume: bool = False) -> Any:
    """The same run in this process (for faults that need no kill of the driver); the
    learner in a thread unless `overrides` say otherwise (one interpreter start less)."""
    import anyio

    from agentrl.config import load_config
    from agentrl.run.orchestrator import Orchestrator

    sets = [*TINY, "orchestrator.learner_worker=thread", f"orchestrator.max_steps={max_steps}"]
    cfg = load_config(overrides=[*sets, *overrides])
    orch = Orchestrator(cfg, run_dir, resume=resume)
    orch.build()
    anyio.run(orch.run)
    return orch


def live(pid: int) -> bool:
    from tests.procs import alive

    return alive(pid)
