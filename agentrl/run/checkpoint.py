"""A run's checkpoints: save one step (the learner's part, then the loop's), resume from
the latest readable one.

The folder format and its crash safety live in :mod:`agentrl.run.checkpoint_files`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.errors import CheckpointError
from agentrl.run.checkpoint_files import (
    CHECKPOINTS,
    COMPLETE_MARKER,
    LATEST,
    LEARNER_PART,
    LOOP_STATE,
    atomic_directory,
    is_complete,
    latest_checkpoint,
    resolve_checkpoint,
)

log = logging.getLogger("agentrl.run.checkpoint")


def save_run_checkpoint(
    run_dir: str | Path,
    step: int,
    loop_state: dict[str, Any],
    save_learner: Callable[[Path], Any],
    keep: int = 2,
) -> Path:
    """Write ``step_N`` atomically (the learner's part, then the loop's), move ``latest``
    to it, and keep the newest `keep` checkpoints."""
    root = Path(run_dir) / CHECKPOINTS
    final = root / f"step_{step:06d}"
    try:
        with atomic_directory(final) as tmp:
            save_learner(tmp / LEARNER_PART)
            (tmp / LOOP_STATE).write_text(json.dumps(loop_state))
    except (OSError, RuntimeError) as e:  # a full disk reaches torch.save as a RuntimeError
        raise _write_failed(run_dir, final, e) from e
    pointer_tmp = root / f".{LATEST}.tmp"
    pointer_tmp.write_text(final.name)
    os.replace(pointer_tmp, root / LATEST)
    for old in sorted(p for p in root.glob("step_*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _write_failed(run_dir: str | Path, final: Path, e: BaseException) -> CheckpointError:
    """The one-line error for a checkpoint that could not be written (the partial folder is
    gone by now): free space on that disk, the size a checkpoint takes, what is kept."""
    previous = latest_checkpoint(run_dir)
    free_mb = shutil.disk_usage(final.parent).free / 2**20
    size = ""
    if previous is not None and previous.is_dir():
        taken = sum(p.stat().st_size for p in previous.rglob("*") if p.is_file())
        size = f", a checkpoint takes {taken / 2**20:.0f} MB"
    kept = (
        f"the previous checkpoint {previous.name} is intact"
        if previous is not None
        else "no earlier checkpoint exists"
    )
    cause = (str(e).strip().splitlines() or [""])[0]
    return CheckpointError(
        f"could not write checkpoint {final.name} in {final.parent} ({free_mb:.0f} MB free"
        f"{size}; disk full?): {type(e).__name__}: {cause}. {kept}: free space, then continue "
        f"with --resume {run_dir}"
    )


def load_run_checkpoint(
    run_dir: str | Path, load_learner: Callable[[Path], Any] | None = None
) -> tuple[Path, dict[str, Any]]:
    """(checkpoint folder, loop state) of the run's latest checkpoint, for ``--resume``.

    `load_learner` restores the learner's part. If the latest checkpoint cannot be read
    (incomplete, bad loop state, a learner part that fails to load), the previous one is
    used, with a warning naming both: a crash costs the steps since then, not the run."""
    root = Path(run_dir) / CHECKPOINTS
    if not has_checkpoint(run_dir):
        raise CheckpointError(
            f"--resume: no checkpoint in {root} (the run never reached checkpoint_every "
            "steps); start it again without --resume"
        )
    first_error: Exception | None = None
    for ckpt in _resume_candidates(run_dir):
        try:
            state = _read_loop_state(ckpt)
            if load_learner is not None:
                load_learner(ckpt / LEARNER_PART)
        except Exception as e:
            log.warning("checkpoint %s is unreadable (%s): trying the previous one", ckpt, e)
            first_error = first_error or e
            continue
        if first_error is not None:
            log.warning(
                "resuming from the previous checkpoint %s (step %s): the latest was corrupt",
                ckpt,
                state.get("step"),
            )
        return ckpt, state
    if isinstance(first_error, CheckpointError):
        raise first_error
    raise CheckpointError(f"no readable checkpoint in {root}: {first_error}") from first_error


def has_checkpoint(run_dir: str | Path) -> bool:
    """Whether ``--resume`` finds a checkpoint to start from (recovering an interrupted one)."""
    return any(is_complete(p) for p in _resume_candidates(run_dir))


def _resume_candidates(run_dir: str | Path) -> list[Path]:
    """The latest checkpoint (recovered by :func:`resolve_checkpoint` if a kill interrupted
    its replacement; as is if it cannot be), then the other complete ``step_*`` folders,
    newest first."""
    root = Path(run_dir) / CHECKPOINTS
    found: list[Path] = []
    pointer = latest_checkpoint(run_dir)
    if pointer is not None:
        try:
            found.append(resolve_checkpoint(run_dir))
        except CheckpointError:
            found.append(pointer)  # load_run_checkpoint reports it and falls back
    older = sorted(root.glob("step_*"), reverse=True)
    return found + [p for p in older if p not in found and is_complete(p)]


def _read_loop_state(ckpt: Path) -> dict[str, Any]:
    state_file = ckpt / LOOP_STATE
    if not is_complete(ckpt):
        raise CheckpointError(f"checkpoint {ckpt} is incomplete (no {COMPLETE_MARKER} marker)")
    if not state_file.is_file():
        raise CheckpointError(f"checkpoint {ckpt} is incomplete (no {LOOP_STATE})")
    try:
        state = json.loads(state_file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint {ckpt}: {LOOP_STATE} is corrupt ({e})") from e
    if not isinstance(state, dict) or "step" not in state:
        raise CheckpointError(f"checkpoint {ckpt}: {LOOP_STATE} has no step")
    return state
