"""The run folder's layout: every file name, the checkpoint format, crash-safe writes, the
metrics and trace lines: writers and readers alike go through here.

    RUN_DIR/config.yaml                                 the whole config (resume reads it)
    RUN_DIR/metrics.jsonl                               one JSON object a line (MetricsFile)
    RUN_DIR/trajectories.jsonl                          one finished group a line (the trace)
    RUN_DIR/eval_trajectories.jsonl                     held-out groups of each evaluation
    RUN_DIR/checkpoints/step_000005/learner/...         the trainer's part: model.safetensors
                                     orchestrator.json  (+ adapter / critic), trainer_state.pt,
                        /latest                         learner.json; the loop's part (step,
                                                        version, task cursor, buffered groups)

A checkpoint folder is written under a temporary name and renamed into place, with a
``COMPLETE`` marker written last, so a SIGKILL at any moment leaves the previous good
checkpoint (or the new complete one) readable; ``latest`` names the newest and moves only
after it is complete. :func:`resolve_checkpoint` finds the folder for a run directory, a
checkpoint or a learner part, recovering one whose replacement a kill interrupted.

Core-level (imports nothing of agentrl but errors): the trainer core below the run layer
writes checkpoints, the run layer, the view, ``agentrl plot`` and ``export`` read them.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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


CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
TRACE = "trajectories.jsonl"
ADVANTAGES = "advantages.jsonl"  # beside the trace: the advantages each trained step used
EVAL_TRACE = "eval_trajectories.jsonl"  # held-out groups of each evaluation, with its step
REPORT = "report.json"
CHECKPOINTS = "checkpoints"
LATEST = "latest"
LOOP_STATE = "orchestrator.json"
LEARNER_PART = "learner"
POLICY_WEIGHTS = "model.safetensors"
ADAPTER_WEIGHTS = "adapter.safetensors"
CRITIC_WEIGHTS = "critic.safetensors"
TRAINER_STATE = "trainer_state.pt"
TRAINER_META = "learner.json"
SHARDED = "sharded"  # the DCP folder inside a sharded trainer's part


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
    meta = part / TRAINER_META
    version = int(json.loads(meta.read_text()).get("version", 0)) if meta.is_file() else 0
    return weights, version


# --- RNG states ---------------------------------------------------------------------


def capture_rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU and CUDA) RNG states; torch parts are tensors."""
    import numpy as np
    import torch

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
    import numpy as np
    import torch

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


# --- the trainer's part of a checkpoint ------------------------------------------------


def write_trainer_files(folder: Path, state: dict[str, Any], meta: dict[str, Any]) -> None:
    """``trainer_state.pt`` (optimizer, scheduler, RNG states, a mode's own state) and
    ``learner.json`` (version, step, what wrote it) into a trainer part being written."""
    import torch

    torch.save(state, Path(folder) / TRAINER_STATE)
    (Path(folder) / TRAINER_META).write_text(json.dumps(meta))


def read_trainer_meta(folder: Path) -> dict[str, Any]:
    """``learner.json`` of a trainer part."""
    return dict(json.loads((Path(folder) / TRAINER_META).read_text()))


def read_trainer_state(folder: Path) -> dict[str, Any]:
    """``trainer_state.pt`` of a trainer part (on the CPU)."""
    import torch

    return dict(torch.load(Path(folder) / TRAINER_STATE, map_location="cpu", weights_only=False))


# --- metrics and trace lines -----------------------------------------------------------


class JsonlFile:
    """Appends one JSON object a line, flushed per line (a crash loses nothing): the run's
    ``metrics.jsonl`` for every trainer, and the trace."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._f = self.path.open("a", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        self._f.write(json.dumps(row, default=str) + "\n")
        self._f.flush()

    def write_line(self, line: str) -> None:
        self._f.write(line.rstrip("\n") + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class MetricsFile(JsonlFile):
    """``metrics.jsonl`` of a trainer without the run loop (dpo, sft): ``kind``, ``step``
    and ``time`` with each line."""

    def log(self, kind: str, step: int, values: dict[str, Any]) -> None:
        self.write({"kind": kind, "step": step, "time": time.time(), **values})


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every line of ``RUN_DIR/metrics.jsonl`` (a torn last line is skipped)."""
    path = Path(run_dir) / METRICS
    rows = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


# --- a run's checkpoints: save one step (the learner's part, then the loop's), resume from
# the latest readable one ----------------------------------------------------------------

log = logging.getLogger("agentrl.runfolder")


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


def walk_session_tree(rows: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], int]]:
    """A trace's session tree (``metadata.gateway.tree`` rows) depth first: each row with
    its depth, children under their parent (`agentrl inspect` and the view both draw it)."""
    children: dict[int | None, list[dict[str, Any]]] = {}
    for row in rows:
        children.setdefault(row.get("parent"), []).append(row)

    def visit(row: dict[str, Any], depth: int) -> Iterator[tuple[dict[str, Any], int]]:
        yield row, depth
        for child in children.get(row["sample"], []):
            yield from visit(child, depth + 1)

    for root in children.get(None, []):
        yield from visit(root, 0)


def shared_with_parent(row: dict[str, Any]) -> str:
    """What a ``continues`` sample shares with its parent; empty for the other relations."""
    if row.get("relation") != "continues":
        return ""
    return f"{row.get('shared_messages', 0)} messages, {row.get('shared_tokens', 0)} tokens shared"
