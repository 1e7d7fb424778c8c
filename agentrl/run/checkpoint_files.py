"""Checkpoint folders on disk: crash-safe writes, the layout, finding one, RNG states.

    RUN_DIR/checkpoints/step_000005/learner/...        the learner's part (model, optimizer,
                                     orchestrator.json  scheduler, RNG); the loop's part (step,
                        /latest                         version, task cursor, buffered groups)

A checkpoint folder is written under a temporary name and renamed into place, with a
``COMPLETE`` marker written last, so a SIGKILL at any moment leaves the previous good
checkpoint (or the new complete one) readable; ``latest`` names the newest and moves only
after it is complete. :func:`resolve_checkpoint` finds the folder for a run directory, a
checkpoint or a learner part, recovering one whose replacement a kill interrupted.
The run's save and resume (:mod:`agentrl.run.checkpoint`) and the learner's own part both
write through here.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.errors import CheckpointError

COMPLETE_MARKER = "COMPLETE"


def _fsync_tree(root: Path) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield a temporary directory that replaces `path` atomically when the block succeeds.

    On an exception the temporary directory is removed and `path` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp = path.parent / f".{path.name}.tmp-{tag}"
    tmp.mkdir()
    try:
        yield tmp
        (tmp / COMPLETE_MARKER).write_text("ok\n")
        _fsync_tree(tmp)
        if path.exists():
            old = path.parent / f".{path.name}.old-{tag}"
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def is_complete(path: str | Path) -> bool:
    return (Path(path) / COMPLETE_MARKER).is_file()


CHECKPOINTS = "checkpoints"
LATEST = "latest"
LOOP_STATE = "orchestrator.json"
LEARNER_PART = "learner"
POLICY_WEIGHTS = "model.safetensors"


def resolve_checkpoint(path: str | Path) -> Path:
    """The complete checkpoint folder `path` stands for.

    A run directory stands for its latest checkpoint. If the folder is missing or
    incomplete, a complete ``.NAME.tmp-*`` sibling (the newer checkpoint) is moved into
    place, else a ``.NAME.old-*`` one (the previous checkpoint).
    """
    path = Path(path)
    latest = latest_checkpoint(path)
    if latest is not None:
        path = latest
    if is_complete(path):
        return path
    if path.parent.is_dir():
        for pattern in (f".{path.name}.tmp-*", f".{path.name}.old-*"):
            found = sorted(
                (p for p in path.parent.glob(pattern) if is_complete(p)),
                key=lambda p: p.stat().st_mtime,
                reverse=True,
            )
            if found:
                if path.exists():
                    shutil.rmtree(path, ignore_errors=True)
                os.rename(found[0], path)
                return path
    raise CheckpointError(
        f"no complete checkpoint at {path} (missing the {COMPLETE_MARKER} marker); pass a run "
        f"directory (its {CHECKPOINTS}/{LATEST}) or a folder RUN_DIR/{CHECKPOINTS}/step_N"
    )


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The checkpoint ``RUN_DIR/checkpoints/latest`` names, or None."""
    root = Path(run_dir) / CHECKPOINTS
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    return root / pointer.read_text().strip()


def policy_weights_file(checkpoint: str | Path) -> tuple[Path, int]:
    """(the policy's safetensors file, its weight version) in a checkpoint folder."""
    part = Path(checkpoint) / LEARNER_PART
    weights = part / POLICY_WEIGHTS
    if not weights.is_file():
        raise CheckpointError(
            f"{checkpoint} has no {LEARNER_PART}/{POLICY_WEIGHTS}: not a training checkpoint"
        )
    meta = part / "learner.json"
    version = int(json.loads(meta.read_text()).get("version", 0)) if meta.is_file() else 0
    return weights, version


# --- RNG states ---------------------------------------------------------------------


def capture_rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU and CUDA) RNG states; torch parts are tensors."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": json.dumps(_to_jsonable(random.getstate())),
        "numpy": json.dumps(
            [
                np_state[0],
                np_state[1].tolist(),
                int(np_state[2]),
                int(np_state[3]),
                float(np_state[4]),
            ]
        ),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_to_tuple(json.loads(state["python"])))
    name, keys, pos, has_gauss, cached = json.loads(state["numpy"])
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _to_jsonable(x: Any) -> Any:
    if isinstance(x, tuple):
        return [_to_jsonable(v) for v in x]
    return x


def _to_tuple(x: Any) -> Any:
    if isinstance(x, list):
        return tuple(_to_tuple(v) for v in x)
    return x
