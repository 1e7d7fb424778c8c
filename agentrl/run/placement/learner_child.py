"""The learner process's own side: ``python -m agentrl.run.placement.learner_child SOCKET
LIFELINE`` joins the rank group (several ranks), builds the learner with the run assembly's
:func:`agentrl.run.components.load_learner`, shares its weights with the parent and serves
its requests over the pipe, one at a time (see :mod:`agentrl.run.placement.learner_process`,
the parent's handle, for the protocol and the failure handling)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from typing import Any

import torch

from agentrl.config import Config
from agentrl.cpu import learner_process_threads, release_freed_memory
from agentrl.devices import limit_process_memory
from agentrl.learner.settings import LearnerSettings
from agentrl.run.components import load_learner
from agentrl.run.placement.faults import Fault, report_phases
from agentrl.run.process_settings import apply_process_settings
from agentrl.weights.gate import FileGate
from agentrl.weights.shared import CudaSharedWeights, SharedWeights, adopt, share_weights

# how long the child may take to load the model and build the learner
START_TIMEOUT_S = 600.0
# a learner group's rank, and rank 0's rendezvous address, for each spawned rank
RANK_ENV = "AGENTRL_LEARNER_RANK"
ADDRESS_ENV = "AGENTRL_LEARNER_ADDRESS"


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


class _NotShared:
    """A rank > 0 of a learner group: it takes part in gathering the weights that rank 0
    shares with the parent, and holds no buffers of its own."""

    def refresh(self, state: Any) -> None:
        pass

    def handle(self) -> None:
        return None

    def unlink(self) -> None:
        pass


def _serve(conn: Connection, lifeline: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent(lifeline)
    shared: SharedWeights | CudaSharedWeights | _NotShared | None = None
    gate: FileGate | None = None
    rank = int(os.environ.get(RANK_ENV, "0"))
    try:
        cfg, settings, path, plugins, fault_fields = conn.recv()
        fault = Fault(*fault_fields) if fault_fields else None
        sys.path[:] = path + [p for p in sys.path if p not in path]
        import importlib

        for module in plugins:  # algorithms the parent's plug-ins registered
            importlib.import_module(module)
        apply_process_settings(cfg)
        learner_process_threads(cfg.orchestrator.cpu_threads, cfg.orchestrator.learner_cpu_threads)
        # learner.gpu_memory_fraction, if any
        limit_process_memory(
            {"learner": (settings.train.torch_device, settings.train.gpu_memory_fraction)}
        )
        if cfg.learner.world_size > 1:
            join_learner_group(settings, rank, os.environ[ADDRESS_ENV])
            settings = rank_settings(cfg, settings)
        learner = load_learner(settings)
        weights = learner.gathered_sampler_weights()  # all ranks gather; rank 0 keeps them
        if cfg.learner.world_size > 1:
            # ("phase", ...) messages before the request's reply; plain values: this module
            # is the child's __main__, its classes do not unpickle in the parent
            report_phases(learner, rank, lambda seen: conn.send(("phase", seen)), fault)
            # every rank has loaded: from now on a collective waits collective_timeout_s
            from agentrl.learner.distributed import set_collective_timeout

            set_collective_timeout(float(cfg.learner.collective_timeout_s))
        if rank == 0:
            kind = settings.train.weight_sharing  # resolved with the settings
            shared = share_weights(weights, kind, shared_dtype(cfg, kind))
            sharded = learner.ranks.parallel == "fsdp"
            if kind == "shared_memory" and not sharded and adopt(learner.model, shared):
                # the parameters live in the shared buffers: one copy of the weights here
                release_freed_memory()  # the parameters' old storage
                # a sampler may compute on them as they train: it and the optimizer take
                # turns (agentrl.weights.gate; uncontended, four flock calls a step)
                gate = FileGate.create()
                learner.use_weight_gate(gate)
        else:
            shared = _NotShared()
        del weights
        gate_handle = gate.handle() if gate is not None else None
        ready = (learner.version, learner.step_count, shared.handle(), gate_handle)
        conn.send(("ready", ready))
    except BaseException as e:
        if shared is not None:
            shared.unlink()
        if gate is not None:
            gate.unlink()
        _reply_error(conn, e)
        return
    while True:
        try:
            op, arg = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            shared.unlink()
            if gate is not None:  # (the parent removes them once opened; it may not have)
                gate.unlink()
            return
        if op == "close":
            shared.unlink()
            if gate is not None:
                gate.unlink()
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
                shared.refresh(learner.gathered_sampler_weights())
            elif op == "save":
                result = str(learner.save_checkpoint(arg))
            elif op == "load":
                learner.load_checkpoint(arg)
                shared.refresh(learner.gathered_sampler_weights())
                result = None
            else:
                raise ValueError(f"unknown learner request {op!r}")
            credit = learner.last_credit if op == "step" else None  # travels with the step
            conn.send(("ok", (result, learner.version, learner.step_count, credit)))
        except BaseException as e:
            _reply_error(conn, e)


def main() -> None:
    """Entry of the child: ``python -m agentrl.run.placement.learner_child SOCKET_FD LIFELINE_FD``."""
    _serve(Connection(int(sys.argv[1])), int(sys.argv[2]))


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


def join_learner_group(
    settings: LearnerSettings, rank: int, address: str, *, local_rank: int | None = None
) -> None:
    """Join the learner's torch.distributed group as `rank` (before the learner is built).
    On CUDA it computes on ``cuda:local_rank``: the rank itself for processes on one node
    (default), 0 in a Ray actor (Ray shows it only its own GPU)."""
    from agentrl.learner.distributed import init_rank_group

    os.environ["LOCAL_RANK"] = str(rank if local_rank is None else local_rank)
    device = torch.device(torch.device(settings.train.device).type)  # the kind: cuda or cpu
    # the ranks meet and load the model under the start timeout; once every rank is ready
    # the group's collectives wait learner.collective_timeout_s (set_collective_timeout)
    init_rank_group(
        rank,
        settings.train.world_size,
        address,
        device=device,
        timeout_s=max(START_TIMEOUT_S, settings.train.collective_timeout_s),
    )


def rank_settings(cfg: Config, settings: LearnerSettings) -> LearnerSettings:
    """A rank's own settings once it joined the group: ``learner.device`` auto / cuda names
    the rank's own GPU (set by the group), as resolving it in this process would."""
    if settings.train.device.startswith("cuda") and cfg.learner.device in ("auto", "cuda"):
        device = f"cuda:{torch.cuda.current_device()}"
        return dataclasses.replace(
            settings, train=dataclasses.replace(settings.train, device=device)
        )
    return settings


if __name__ == "__main__":
    main()
