"""Fault scenarios that kill the driver, shared by ``tests/faults`` (a few moments) and
``benchmarks/faults.py`` (ten): each returns its figures as a dict."""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path
from typing import Any

from .harness import (
    audit,
    checkpoint_state,
    driver_log,
    read_events,
    stale_processes,
    start_driver,
    wait_until,
)

MOMENTS = ("before_first_step", "during_step", "during_checkpoint_write", "while_buffered")
START_TIMEOUT_S = 600.0  # a loaded 2-core machine takes minutes to import torch twice


def _count(run_dir: Path, event: str) -> int:
    if not (run_dir / "metrics.jsonl").exists():
        return 0
    return sum(1 for r in read_events(run_dir) if r["event"] == event)


def _writing_checkpoint(run_dir: Path) -> bool:
    root = run_dir / "checkpoints"
    return root.is_dir() and any(p.name.startswith(".step_") for p in root.iterdir())


def _buffered_since(run_dir: Path, step: int) -> bool:
    state = checkpoint_state(run_dir)
    return state is not None and state["step"] > step and bool(state["buffer"]["groups"])


def _wait_for(moment: str, run_dir: Path, proc: Any, rng: random.Random) -> bool:
    """Block until `moment` of the current driver; False if it exited first."""
    started = _count(run_dir, "RunStarted")
    trained = _count(run_dir, "BatchTrained")
    state = checkpoint_state(run_dir)
    step0 = state["step"] if state else 0
    if moment == "before_first_step":
        ok = wait_until(lambda: _count(run_dir, "RunStarted") > started, proc, START_TIMEOUT_S)
        time.sleep(rng.uniform(0.0, 0.3))
        return ok and proc.poll() is None
    if moment == "during_step":
        ok = wait_until(lambda: _count(run_dir, "BatchTrained") > trained, proc, START_TIMEOUT_S)
        time.sleep(rng.uniform(0.0, 0.6))  # somewhere in the next step
        return ok and proc.poll() is None
    if moment == "during_checkpoint_write":
        wait_until(lambda: _count(run_dir, "RunStarted") > started, proc, START_TIMEOUT_S)
        ok = wait_until(lambda: _writing_checkpoint(run_dir), proc, START_TIMEOUT_S)
        time.sleep(rng.uniform(0.0, 0.05))
        return ok and proc.poll() is None
    if moment == "while_buffered":
        return wait_until(lambda: _buffered_since(run_dir, step0), proc, START_TIMEOUT_S)
    raise ValueError(f"unknown moment {moment!r} (one of {MOMENTS})")


def driver_kills(
    run_dir: Path, moments: list[str], max_steps: int, seed: int = 0, *overrides: str
) -> dict[str, Any]:
    """SIGKILL the driver at each of `moments` in turn, ``--resume`` after each, let the
    last one finish; audit the run."""
    rng = random.Random(seed)
    kills: list[dict[str, Any]] = []
    orphans = 0
    proc = start_driver(run_dir, max_steps, *overrides)
    for moment in moments:
        hit = _wait_for(moment, run_dir, proc, rng)
        if proc.poll() is None:
            proc.kill()  # SIGKILL, the driver only: what it spawned must go by itself
        proc.wait()
        orphans += stale_processes(proc.pid)
        state = checkpoint_state(run_dir) or {"step": 0, "buffer": {"groups": []}, "cursor": {}}
        kills.append(
            {
                "moment": moment,
                "hit": hit,
                "checkpoint_step": state["step"],
                "buffered": [g["group_id"] for g in state["buffer"]["groups"]],
                "reissued": list(state["cursor"].get("reissue", [])),
            }
        )
        proc = start_driver(run_dir, max_steps, *overrides, resume=True)
    try:
        finished = proc.wait(timeout=START_TIMEOUT_S) == 0
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        finished = False
    orphans += stale_processes(proc.pid)
    a = audit(run_dir)
    restored = trained = reissued = reissued_trained = 0
    for k in kills:
        indices, ids = a.trained_since(k["checkpoint_step"])
        restored += len(k["buffered"])
        trained += sum(1 for g in k["buffered"] if g in ids)
        reissued += len(k["reissued"])
        reissued_trained += sum(1 for i in k["reissued"] if i in indices)
    return {
        "scenario": "driver SIGKILL x resume",
        "kills": len(kills),
        "moments_hit": sum(k["hit"] for k in kills),
        "moments": [k["moment"] for k in kills],
        "runs": len(kills) + 1,
        "survived": bool(finished and a.steps_ok and a.final_step == max_steps),
        "final_step": a.final_step,
        "steps_lost": len(a.steps_lost),
        "steps_redone": a.steps_redone,
        "samples_trained": a.samples_trained,
        "trained_twice": a.trained_twice,
        "buffered_restored": restored,
        "buffered_trained_after_resume": trained,
        "reissued": reissued,
        "reissued_trained_after_resume": reissued_trained,
        "orphans": orphans,
        "checkpoint_loadable": a.checkpoint_loadable,
        "error": "" if finished else driver_log(run_dir)[-2000:],
    }
