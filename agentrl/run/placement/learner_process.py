"""The learner in its own process, behind the methods the orchestrator calls.

    learner = LearnerProcess(cfg, settings)             # spawns, loads the model over there
    metrics = learner.step(groups)                      # blocking; run it in a worker thread
    weights = learner.state_dict_for_sampler()          # shared-memory views, version N
    learner.close()

Why a process: the hf sampler's decode loop and the learner's forward/backward are both
Python loops issuing many small torch ops. In one process they take turns on one GIL, so
both slow down when they compute at the same time (``benchmarks/async_vs_sync.py``
measures the end-to-end effect).

The child builds its :class:`~agentrl.learner.Learner` with the run assembly's
:func:`agentrl.run.components.load_learner` (as a thread learner is built) after applying the
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
with its exit code. With several ranks, each reports the phase of the step it starts
(:attr:`Learner.on_phase`, :meth:`LearnerProcess.phases`), so a rank that dies is named
with where it was, and one that stops taking part ends the step once its peers' collective
gives up (``learner.collective_timeout_s``), named the same way. A :class:`Fault` handed to
the constructor kills or holds a rank at a named phase, for drills and tests (a run reads one
from ``AGENTRL_LEARNER_FAULT`` at its assembly, :func:`drill_fault`). The child
ignores SIGINT and SIGTERM (Ctrl-C reaches the whole process
group; the orchestrator finishes the step and asks for the checkpoint) and exits as soon
as its parent is gone (a lifeline pipe only the parent holds), so no orphan is left.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import astuple
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from agentrl.algos.registry import plugin_modules
from agentrl.config import Config
from agentrl.cpu import allocator_env
from agentrl.errors import AgentRLError
from agentrl.learner.credit_record import StepCredit
from agentrl.learner.settings import LearnerSettings
from agentrl.run.placement.faults import FAULT_ENV, Fault, RankPhase, drill_fault, report_phases
from agentrl.run.placement.learner_child import (
    ADDRESS_ENV,
    RANK_ENV,
    START_TIMEOUT_S,
    join_learner_group,
    rank_settings,
    shared_dtype,
)
from agentrl.run.settings import resolve
from agentrl.weights.gate import FileGate
from agentrl.weights.shared import attach

log = logging.getLogger(__name__)

# after one rank fails, how long the others may take to show whether one of them died first
# (its death is the cause: a peer's collective fails as soon as its sockets close)
ATTRIBUTE_S = 5.0


class LearnerError(AgentRLError):
    """The learner process failed to start or died."""


class _Rank:
    """One spawned learner process (a rank of the group) and the parent's end of its pipe."""

    def __init__(self, rank: int, world_size: int, address: str, allocator: str) -> None:
        # a fresh interpreter, not multiprocessing's spawn: that re-runs the user's __main__
        # module in the child, which breaks any training script without a __main__ guard
        self.rank = rank
        mine, theirs = socket.socketpair()
        lifeline_r, self.lifeline = os.pipe()  # the child exits when this end closes
        # orchestrator.cpu_allocator: tcmalloc (auto, where installed) is preloaded at start
        env = allocator_env(allocator, os.environ)
        root = str(Path(__file__).resolve().parents[3])  # where `agentrl` imports from
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        # idle OpenMP threads sleep instead of spinning: spinning ones would take CPU from
        # the sampler's threads in the other process (2 cores: 19-23 vs 28 traj/s in
        # benchmarks/async_vs_sync.py)
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        if world_size > 1:  # one GPU per rank on this node (torch.cuda.set_device)
            env.update({RANK_ENV: str(rank), ADDRESS_ENV: address, "LOCAL_RANK": str(rank)})
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentrl.run.placement.learner_child",
                str(theirs.fileno()),
                str(lifeline_r),
            ],
            pass_fds=[theirs.fileno(), lifeline_r],
            env=env,
        )
        theirs.close()
        os.close(lifeline_r)
        self.conn = Connection(mine.detach())

    def name(self, world_size: int) -> str:
        return "the learner process" if world_size == 1 else f"learner rank {self.rank}"

    def why_dead(self) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        code = self.proc.returncode
        return f"killed by signal {-code}" if code is not None and code < 0 else f"exit {code}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)


class LearnerProcess:
    """A :class:`~agentrl.learner.Learner` running in spawned child processes: one, or
    ``learner.world_size`` ranks of one torch.distributed group on this machine
    (:mod:`agentrl.learner.distributed`).

    Offers what the orchestrator uses: :meth:`step`, :meth:`state_dict_for_sampler`,
    :meth:`save_checkpoint`, :meth:`load_checkpoint`, :attr:`version`, plus :meth:`close`.
    Requests are served one at a time (calls from several threads queue on a lock); every
    rank gets each request, rank 0 answers it and shares the weights. A rank that dies or
    fails ends the request with an error naming it, and stops the others (the group is
    broken; the last checkpoint is intact for ``--resume``).
    """

    def __init__(
        self, cfg: Config, settings: LearnerSettings | None = None, *, fault: Fault | None = None
    ) -> None:
        """`settings`: the run's resolved learner settings (default: resolved here); `fault`:
        a drill's injected fault (tests, ``AGENTRL_LEARNER_FAULT`` read by the assembly)."""
        settings = settings or resolve(cfg).learner
        self.world_size = int(cfg.learner.world_size)
        self.collective_timeout_s = float(cfg.learner.collective_timeout_s)
        # where each rank has been in the request under way (RankPhase, in order)
        self._seen = threading.Condition()
        self._history: dict[int, list[RankPhase]] = {}
        address = f"tcp://127.0.0.1:{free_port()}" if self.world_size > 1 else ""
        allocator = cfg.orchestrator.cpu_allocator
        self._ranks = [
            _Rank(r, self.world_size, address, allocator) for r in range(self.world_size)
        ]
        self._lock = threading.Lock()
        self._ready = False
        self._closed = False
        self._stopped = False  # close() ran
        self.version = 0
        self.step_count = 0
        self.last_credit: StepCredit | None = None  # sent back with each step's reply
        self._weights: dict[str, Tensor] = {}
        self._gate: FileGate | None = None  # around the child's writes to those weights
        for rank in self._ranks:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                # a child that died at once is reported by wait_ready, with its exit status
                # the fault as plain fields: this module is the child's __main__
                fields = astuple(fault) if fault is not None else None
                rank.conn.send(
                    (cfg, settings, [p for p in sys.path if p], plugin_modules(), fields)
                )

    @property
    def _proc(self) -> subprocess.Popen[bytes]:
        """Rank 0's process (the only one of a single learner)."""
        return self._ranks[0].proc

    @property
    def pids(self) -> list[int]:
        """The process id of each rank, in rank order."""
        return [rank.proc.pid for rank in self._ranks]

    # the child loads the model while the parent builds the rest; the first request waits
    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        with self._lock:
            self._wait_ready_locked(timeout)

    def _wait_ready_locked(self, timeout: float) -> None:
        if self._closed:
            raise LearnerError("the learner process was closed")
        if self._ready:
            return
        try:
            replies = self._replies("starting", timeout)
        except _Timeout:
            self._kill()
            raise LearnerError(
                f"the learner process did not start within {timeout:.0f} s (loading the model "
                "and building the learner); set orchestrator.learner_worker=thread to train "
                "in this process"
            ) from None
        for rank, (kind, payload) in replies:
            if kind == "error":
                exc, tb = payload
                self._kill()
                raise LearnerError(
                    f"{rank.name(self.world_size)} failed to start: {type(exc).__name__}: "
                    f"{exc}\n(in the learner process)\n{tb}"
                    "Algorithms registered in an importable module are registered there too, "
                    "but not ones registered in a script's __main__; move them into a module, "
                    "or set orchestrator.learner_worker=thread to train in this process"
                ) from exc
        self.version, self.step_count, handle, gate_handle = replies[0][1][1]
        # shared-memory files are unlinked once mapped here (nothing left to clean up);
        # CUDA IPC buffers are the child's device memory, opened by handle
        self._weights = attach(handle)
        if gate_handle is not None:  # the child's parameters are those buffers
            self._gate = FileGate.open(gate_handle)
            self._gate.unlink()  # opened: nothing left to clean up either
        self._ready = True

    def _replies(self, doing: str, timeout: float | None = None) -> list[tuple[_Rank, Any]]:
        """One reply from every rank, in rank order (phase reports are recorded on the way).
        A rank that dies, or (with several ranks) one that reports an error, stops the rest:
        their collectives would wait."""
        waiting = {rank.conn: rank for rank in self._ranks}
        got: dict[int, Any] = {}
        while waiting:
            ready = wait(list(waiting), timeout)
            if not ready:
                raise _Timeout
            for conn in ready:
                rank = waiting.pop(conn)  # type: ignore[call-overload]
                reply = self._receive(rank, doing)
                if reply[0] == "phase":
                    waiting[rank.conn] = rank  # still inside the request
                    continue
                got[rank.rank] = reply
                if reply[0] == "error" and self.world_size > 1 and waiting:
                    self._dead_first(waiting, doing)  # the cause, when a peer died first
                    self._kill()  # the others wait on a collective with the failed rank
                    return [(rank, reply)]
        return [(rank, got[rank.rank]) for rank in self._ranks]

    def _receive(self, rank: _Rank, doing: str) -> tuple[str, Any]:
        """The next message of `rank`: ``(kind, payload)``; raises when it died."""
        try:
            msg = rank.conn.recv()
        except (EOFError, OSError):
            why = rank.why_dead()
            seen = self.phases().get(rank.rank)
            self._kill()
            where = f"; it was in {seen}" if seen is not None else ""
            hint = (
                ""
                if seen is not None and seen.fault
                else " (out of memory? try a smaller learner.micro_batch_size)"
            )
            raise LearnerError(
                f"{rank.name(self.world_size)} died while {doing} ({why}{where}); the last "
                f"checkpoint is intact{hint}"
            ) from None
        if msg[0] == "phase":
            seen = RankPhase(*msg[1])
            with self._seen:
                self._history.setdefault(rank.rank, []).append(seen)
                self._seen.notify_all()
            return ("phase", seen)
        return ("error", msg[1:]) if msg[0] == "error" else (msg[0], msg[1])

    def _dead_first(self, waiting: dict[Any, _Rank], doing: str) -> None:
        """After one rank failed: raise the death of another if it shows within
        :data:`ATTRIBUTE_S` (its peers' collectives fail when its sockets close, which
        is also when its pipe does: the death is the cause, not their errors)."""
        deadline = time.monotonic() + ATTRIBUTE_S
        while waiting and (left := deadline - time.monotonic()) > 0:
            for conn in wait(list(waiting), left):
                rank = waiting.pop(conn)  # type: ignore[call-overload]
                if self._receive(rank, doing)[0] == "phase":  # raises if it died
                    waiting[conn] = rank

    def phases(self) -> dict[int, RankPhase]:
        """Where each rank was last seen in the request under way (or the last one): the
        phase of the step it started last. Ranks report with ``learner.world_size > 1``."""
        with self._seen:
            return {r: seen[-1] for r, seen in self._history.items() if seen}

    def wait_for_phase(
        self, rank: int, phase: str, *, fault: str = "", timeout: float | None = None
    ) -> RankPhase:
        """Block until `rank` has started `phase` in the request under way (with `fault`:
        and the injected fault acted there); returns that report. For drills and
        tests that act on a rank at a known point of a step."""

        def reached() -> RankPhase | None:
            for seen in self._history.get(rank, []):
                if seen.phase == phase and (not fault or seen.fault == fault):
                    return seen
            return None

        with self._seen:
            if not self._seen.wait_for(lambda: reached() is not None, timeout):
                raise TimeoutError(f"learner rank {rank} did not reach {phase} in {timeout} s")
            return reached()  # type: ignore[return-value]

    def _call(self, op: str, arg: Any, doing: str) -> Any:
        with self._lock:
            self._wait_ready_locked(START_TIMEOUT_S)
            with self._seen:
                self._history.clear()
            for rank in self._ranks:
                try:
                    rank.conn.send((op, arg))
                except (BrokenPipeError, OSError):
                    pass  # the reply read below reports why
            replies = self._replies(doing)
            failed = [(rank, payload) for rank, (kind, payload) in replies if kind == "error"]
            if failed and self.world_size > 1:
                self._closed = True  # a group with a failed rank cannot go on
        if failed:
            rank, (exc, tb) = failed[0]
            where = "the learner process" if self.world_size == 1 else f"learner rank {rank.rank}"
            if self.world_size > 1 and timed_out(exc):
                raise LearnerError(self._timeout_message(rank.rank, doing)) from exc
            if isinstance(exc, Exception):
                exc.add_note(f"(raised in {where})\n{tb}")
                raise exc
            raise LearnerError(f"{doing} failed in {where}:\n{tb}")
        result, self.version, self.step_count, credit = replies[0][1][1]
        if op == "step":
            self.last_credit = credit
        return result

    def _timeout_message(self, rank: int, doing: str) -> str:
        seen = self.phases()
        others = "; ".join(
            f"rank {r} last seen in {seen[r]}" if r in seen else f"rank {r} not seen in the step"
            for r in range(self.world_size)
            if r != rank
        )
        where = f" in {seen[rank]}" if rank in seen else ""
        return (
            f"learner rank {rank} waited {self.collective_timeout_s:g} s "
            f"(learner.collective_timeout_s) for the other ranks in a collective{where} "
            f"while {doing}: {others}; the group is stopped, the last checkpoint is intact"
        )

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

    def weight_gate(self) -> FileGate | None:
        """The gate a sampler computing on :meth:`state_dict_for_sampler` takes around each
        forward pass while the child trains (an asynchronous run), or None when the child's
        parameters are not those buffers (LoRA, FSDP, CUDA IPC): they then change only at
        a step, which a publish's copy never overlaps."""
        with self._lock:
            self._wait_ready_locked(START_TIMEOUT_S)
            return self._gate

    def sampler_weights(self) -> None:
        """None: the publish reads :meth:`state_dict_for_sampler` (the views change when the
        child steps)."""
        return None

    def save_checkpoint(self, directory: str | Path) -> Path:
        return Path(self._call("save", str(directory), "saving a checkpoint"))

    def load_checkpoint(self, directory: str | Path) -> None:
        self._call("load", str(directory), "loading a checkpoint")

    def close(self, timeout: float = 30.0) -> None:
        """Stop the children (after their current request); idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = self._closed = True
            for rank in self._ranks:
                if rank.proc.poll() is None:
                    with contextlib.suppress(Exception):
                        rank.conn.send(("close", None))
            for rank in self._ranks:
                with contextlib.suppress(Exception):
                    if rank.proc.poll() is None and rank.conn.poll(timeout):
                        rank.conn.recv()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    rank.proc.wait(timeout=5)
            self._kill()
            for rank in self._ranks:
                rank.conn.close()
                with contextlib.suppress(OSError):
                    os.close(rank.lifeline)
            self._weights = {}  # a sampler computing on them keeps them (and the lock) alive

    def _kill(self) -> None:
        for rank in self._ranks:
            rank.kill()


class _Timeout(Exception):
    """No reply within the time asked for."""


def timed_out(exc: BaseException) -> bool:
    """Whether a rank's error is a collective that gave up waiting (gloo: "Timed out
    waiting ... for recv"; NCCL's watchdog: "collective operation timeout")."""
    text = str(exc).lower()
    return "timed out" in text or "operation timeout" in text


def free_port() -> int:
    """A TCP port free on this machine now, for rank 0's rendezvous store."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


__all__ = [
    "ATTRIBUTE_S",
    "FAULT_ENV",
    "Fault",
    "LearnerError",
    "LearnerProcess",
    "RankPhase",
    "drill_fault",
    "free_port",
    "join_learner_group",
    "rank_settings",
    "report_phases",
    "shared_dtype",
    "timed_out",
]
