"""The learner in its own process, behind the methods the orchestrator calls.

    learner = LearnerProcess(cfg)                       # spawns, loads the model over there
    metrics = learner.step(groups)                      # blocking; run it in a worker thread
    weights = learner.state_dict_for_sampler()          # shared-memory views, version N
    learner.close()

Why a process: the hf sampler's decode loop and the learner's forward/backward are both
Python loops issuing many small torch ops. In one process they take turns on one GIL, so
both slow down when they compute at the same time (``benchmarks/async_vs_sync.py``
measures the end-to-end effect).

The child builds its :class:`~agentrl.learner.Learner` with the run assembly's
:func:`agentrl.components.load_learner` (as a thread learner is built) after applying the
run's process settings, and serves requests over a pipe, one at a
time. Weights come back through shared buffers: one flat buffer per dtype, allocated once,
refreshed after every step and every checkpoint load, and mapped into this process as
views (tied weights share one slot): shared-memory files, or with the learner on CUDA the
child's device buffers opened by CUDA IPC handle (``learner.weight_sharing``,
:mod:`agentrl.weights.shared`), so a GPU sampler copies them without a trip through host
memory. With LoRA they hold the merged policy; where they are such a copy and the hf sampler
computes in a half type (``model.dtype: bfloat16`` / ``float16``) they are kept in that
type (:func:`shared_dtype`). Otherwise, on CPU, the child's float32 parameters *are* the
shared buffers (:func:`~agentrl.weights.shared.adopt`): one copy of the weights in the
child, nothing copied after a step. The views hold version :attr:`version` until the next
:meth:`step` or :meth:`load_checkpoint`; the sampler copies them into its own weights
before the publish returns, which the orchestrator awaits before the next step.

Failure handling: an exception inside a request comes back and is raised here with the
child's traceback; a child that dies (killed, out of memory) raises :class:`LearnerError`
with its exit code. The child ignores SIGINT and SIGTERM (Ctrl-C reaches the whole process
group; the orchestrator finishes the step and asks for the checkpoint) and exits as soon
as its parent is gone (a lifeline pipe only the parent holds), so no orphan is left.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from agentrl.algos.registry import plugin_modules
from agentrl.components import load_learner
from agentrl.cpu import learner_process_threads, release_freed_memory
from agentrl.devices import limit_process_memory, sharing_kind
from agentrl.errors import AgentRLError
from agentrl.process_settings import apply_process_settings
from agentrl.weights.shared import (
    CudaSharedWeights,
    SharedWeights,
    adopt,
    attach,
    share_weights,
)

log = logging.getLogger(__name__)

# how long the child may take to load the model and build the learner
START_TIMEOUT_S = 600.0


class LearnerError(AgentRLError):
    """The learner process failed to start or died."""


# --- the child -----------------------------------------------------------------------------


def _die_with_parent(lifeline: int) -> None:
    """Exit as soon as the parent is gone: `lifeline` is the read end of a pipe only the
    parent holds open, so a read returns (empty) exactly when it exits or is killed.
    (``PR_SET_PDEATHSIG`` would fire when the *thread* that spawned the child exits, and
    the orchestrator builds in a worker thread that a thread pool retires when idle.)"""

    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(lifeline, 1):
                pass
        os._exit(1)

    threading.Thread(target=watch, name="agentrl-lifeline", daemon=True).start()


def _reply_error(conn: Connection, e: BaseException) -> None:
    tb = traceback.format_exc()
    try:
        conn.send(("error", e, tb))
    except Exception:  # the exception itself does not pickle
        conn.send(("error", RuntimeError(f"{type(e).__name__}: {e}"), tb))


def _serve(conn: Connection, lifeline: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent(lifeline)
    shared: SharedWeights | CudaSharedWeights | None = None
    try:
        cfg, path, plugins = conn.recv()
        sys.path[:] = path + [p for p in sys.path if p not in path]
        import importlib

        for module in plugins:  # algorithms the parent's plug-ins registered
            importlib.import_module(module)
        apply_process_settings(cfg)
        learner_process_threads(cfg.orchestrator.cpu_threads, cfg.orchestrator.learner_cpu_threads)
        limit_process_memory(cfg, ["learner"])  # learner.gpu_memory_fraction, if any
        learner = load_learner(cfg)
        kind = sharing_kind(cfg.learner.weight_sharing, learner.device)
        shared = share_weights(learner.sampler_weights(), kind, shared_dtype(cfg, kind))
        if kind == "shared_memory" and adopt(learner.model, shared):
            # the parameters live in the shared buffers: one copy of the weights here
            release_freed_memory()  # the parameters' old storage
        ready = (learner.version, learner.step_count, shared.handle())
        conn.send(("ready", ready))
    except BaseException as e:
        if shared is not None:
            shared.unlink()
        _reply_error(conn, e)
        return
    while True:
        try:
            op, arg = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            shared.unlink()
            return
        if op == "close":
            shared.unlink()
            conn.send(("ok", None))
            conn.close()
            # nothing is left to flush (checkpoints are written and closed by now); a normal
            # interpreter exit tears down torch, inductor's workers and the model for ~1 s
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        try:
            if op == "step":
                result: Any = learner.step(arg)
                shared.refresh(learner.sampler_weights())
            elif op == "save":
                result = str(learner.save_checkpoint(arg))
            elif op == "load":
                learner.load_checkpoint(arg)
                shared.refresh(learner.sampler_weights())
                result = None
            else:
                raise ValueError(f"unknown learner request {op!r}")
            conn.send(("ok", (result, learner.version, learner.step_count)))
        except BaseException as e:
            _reply_error(conn, e)


def main() -> None:
    """Entry of the child: ``python -m agentrl.placement.learner_process SOCKET_FD LIFELINE_FD``."""
    _serve(Connection(int(sys.argv[1])), int(sys.argv[2]))


# --- the parent's handle ----------------------------------------------------------------------


def shared_dtype(cfg: Any, kind: str = "shared_memory") -> torch.dtype | None:
    """The dtype the shared weights are kept in (None: the learner's float32).

    In shared memory without LoRA the learner's float32 parameters themselves become the
    shared buffers (:func:`~agentrl.weights.shared.adopt`): one copy of the weights, which a
    bf16 hf sampler casts from at a publish. Otherwise (CUDA IPC, LoRA's merged policy) the buffers are a copy: in the hf
    sampler's own half type when ``model.dtype`` names one (half the bytes, and the cast the
    sampler's copy would make is made once, over there, with the same result)."""
    if kind == "shared_memory" and cfg.model.lora is None:
        return None
    if cfg.sampler.backend != "hf" or cfg.model.dtype not in ("bfloat16", "float16"):
        return None
    return getattr(torch, cfg.model.dtype)


class LearnerProcess:
    """A :class:`~agentrl.learner.Learner` running in a spawned child process.

    Offers what the orchestrator uses: :meth:`step`, :meth:`state_dict_for_sampler`,
    :meth:`save_checkpoint`, :meth:`load_checkpoint`, :attr:`version`, plus :meth:`close`.
    Requests are served one at a time (calls from several threads queue on a lock).
    """

    def __init__(self, cfg: Any) -> None:
        # a fresh interpreter, not multiprocessing's spawn: that re-runs the user's __main__
        # module in the child, which breaks any training script without a __main__ guard
        mine, theirs = socket.socketpair()
        lifeline_r, self._lifeline = os.pipe()  # the child exits when this end closes
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # where `agentrl` imports from
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        # idle OpenMP threads sleep instead of spinning: spinning ones would take CPU from
        # the sampler's threads in the other process (2 cores: 19-23 vs 28 traj/s in
        # benchmarks/async_vs_sync.py)
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentrl.placement.learner_process",
                str(theirs.fileno()),
                str(lifeline_r),
            ],
            pass_fds=[theirs.fileno(), lifeline_r],
            env=env,
        )
        theirs.close()
        os.close(lifeline_r)
        self._conn = Connection(mine.detach())
        self._lock = threading.Lock()
        self._ready = False
        self._closed = False
        self.version = 0
        self.step_count = 0
        self._weights: dict[str, Tensor] = {}
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            # a child that died at once is reported by wait_ready, with its exit status
            self._conn.send((cfg, [p for p in sys.path if p], plugin_modules()))

    # the child loads the model while the parent builds the rest; the first request waits
    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        with self._lock:
            self._wait_ready_locked(timeout)

    def _wait_ready_locked(self, timeout: float) -> None:
        if self._closed:
            raise LearnerError("the learner process was closed")
        if self._ready:
            return
        if not self._conn.poll(timeout):
            self._kill()
            raise LearnerError(
                f"the learner process did not start within {timeout:.0f} s (loading the model "
                "and building the learner); set orchestrator.learner_worker=thread to train "
                "in this process"
            )
        kind, payload = self._recv("starting")
        if kind == "error":
            exc, tb = payload
            self._kill()
            raise LearnerError(
                f"the learner process failed to start: {type(exc).__name__}: {exc}\n"
                f"(in the learner process)\n{tb}"
                "Algorithms registered in an importable module are registered there too, but "
                "not ones registered in a script's __main__; move them into a module, or set "
                "orchestrator.learner_worker=thread to train in this process"
            ) from exc
        self.version, self.step_count, handle = payload
        # shared-memory files are unlinked once mapped here (nothing left to clean up);
        # CUDA IPC buffers are the child's device memory, opened by handle
        self._weights = attach(handle)
        self._ready = True

    def _recv(self, doing: str) -> tuple[str, Any]:
        try:
            msg = self._conn.recv()
        except (EOFError, OSError):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
            code = self._proc.returncode
            why = f"killed by signal {-code}" if code is not None and code < 0 else f"exit {code}"
            raise LearnerError(
                f"the learner process died while {doing} ({why}); the last checkpoint is "
                "intact (out of memory? try a smaller learner.micro_batch_size)"
            ) from None
        kind = msg[0]
        if kind == "error":
            return "error", msg[1:]
        return kind, msg[1]

    def _call(self, op: str, arg: Any, doing: str) -> Any:
        with self._lock:
            self._wait_ready_locked(START_TIMEOUT_S)
            try:
                self._conn.send((op, arg))
            except (BrokenPipeError, OSError):
                pass  # the reply read below reports why
            kind, payload = self._recv(doing)
        if kind == "error":
            exc, tb = payload
            if isinstance(exc, Exception):
                exc.add_note(f"(raised in the learner process)\n{tb}")
                raise exc
            raise LearnerError(f"{doing} failed in the learner process:\n{tb}")
        result, self.version, self.step_count = payload
        return result

    # --- what the orchestrator calls -----------------------------------------------------

    def step(self, groups: Sequence[Any]) -> dict[str, float]:
        """One training step in the learner process; returns its metrics. Blocking."""
        return self._call("step", list(groups), "training a step")

    def state_dict_for_sampler(self, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
        """Version :attr:`version`'s weights as shared-memory views (valid until the next
        step or load), or cast copies when `dtype` differs."""
        with self._lock:
            self._wait_ready_locked(START_TIMEOUT_S)
            weights = dict(self._weights)
        if dtype is None:
            return weights
        return {k: v.to(dtype) for k, v in weights.items()}

    def sampler_weights(self) -> None:
        """None: the publish reads :meth:`state_dict_for_sampler` (the views change when the
        child steps)."""
        return None

    def save_checkpoint(self, directory: str | Path) -> Path:
        return Path(self._call("save", str(directory), "saving a checkpoint"))

    def load_checkpoint(self, directory: str | Path) -> None:
        self._call("load", str(directory), "loading a checkpoint")

    def close(self, timeout: float = 30.0) -> None:
        """Stop the child (after its current request); idempotent."""
        if self._closed:
            return
        with self._lock:
            self._closed = True
            if self._proc.poll() is None:
                with contextlib.suppress(Exception):
                    self._conn.send(("close", None))
                    if self._conn.poll(timeout):
                        self._conn.recv()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
            self._kill()
            self._conn.close()
            with contextlib.suppress(OSError):
                os.close(self._lifeline)
            self._weights = {}  # a sampler computing on them keeps them (and the lock) alive

    def _kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=5)


if __name__ == "__main__":
    main()
