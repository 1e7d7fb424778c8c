"""The engine on ``learner.world_size`` ranks of one torch.distributed group on this machine.

    engine = start_rank_engine(settings, state_dir)   # a RemoteEngine over n child processes

Every rank is a fresh interpreter (``python -m agentrl.run.tinker.ranks``, as the RL
learner's ranks are) holding a :class:`RankEngine`. The server sends each request to every
rank and answers with rank 0's reply, so the ranks run the same calls in the same order:

* the base model is held as ``learner.parallel`` says, with the learner's own
  :class:`~agentrl.learner.distributed.Strategy`: ``fsdp`` shards it ``1/n`` per rank
  (FSDP2, each decoder layer and the root), ``ddp`` keeps a whole copy per rank;
* each client's LoRA adapter and AdamW are replicated on every rank and trained data
  parallel: ``forward_backward`` splits the datums among the ranks (a rank with none runs
  a padding datum whose loss is multiplied by 0: every FSDP forward is a collective), and
  ``optim_step`` sums the adapter's gradients over the ranks (the learner's DDP bucketed
  all-reduce) before the same AdamW step on every rank, so the copies stay equal;
* sampling decodes the whole batch on every rank with one shared seed (the all-gathered
  weights are the same, so are the tokens); only rank 0 writes checkpoints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import secrets
import socket
import subprocess
import sys
import traceback
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from agentrl.learner.distributed import (
    Ranks,
    Strategy,
    init_rank_group,
    leave_rank_group,
    set_collective_timeout,
)
from agentrl.run.tinker.adapters import RequestError
from agentrl.run.tinker.engine import Engine
from agentrl.run.tinker.remote import RemoteEngine, describe, run_method
from agentrl.run.tinker.wire import ForwardBackwardCall

START_TIMEOUT_S = 600.0  # loading the model on every rank


class RankEngine(Engine):
    """An :class:`Engine` that is one rank of the group (see the module's docstring)."""

    def __init__(self, *args: Any, ranks: Ranks, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ranks = ranks
        # the adapters are replicated whatever holds the base: their gradients are summed
        self._adapter_sum = Strategy(
            Ranks(ranks.rank, ranks.world_size, "ddp"), self.device, bf16=False
        )

    @property
    def placement(self) -> str:
        return f"{self.ranks.world_size} ranks ({self.ranks.parallel})"

    def forward_backward(
        self, call: ForwardBackwardCall, loss_scale: float = 1.0
    ) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        n, rank = self.ranks.world_size, self.ranks.rank
        mine = list(range(rank, len(call.data), n))
        outputs: list[dict[str, np.ndarray]] = []
        total = 0.0
        if mine:
            outputs, metrics = super().forward_backward(
                dataclasses.replace(call, data=[call.data[i] for i in mine])
            )
            total = metrics["loss:sum"]
        elif self.ranks.lockstep:  # FSDP: this rank's forward and backward still meet
            super().forward_backward(dataclasses.replace(call, data=call.data[:1]), loss_scale=0.0)
        gathered: list[Any] = [None] * n
        dist.all_gather_object(gathered, (mine, outputs, total))
        by_index = {i: out for idx, outs, _ in gathered for i, out in zip(idx, outs, strict=True)}
        merged = [by_index[i] for i in range(len(call.data))]
        return merged, {"loss:sum": float(sum(t for _, _, t in gathered))}

    def _combine_gradients(self, params: list[torch.nn.Parameter]) -> None:
        self._adapter_sum.reduce_gradients(list(params))

    def adapter_state(self, model_id: str) -> dict[str, torch.Tensor]:
        """Rank 0's copy, after checking every rank holds the same one (bitwise)."""
        state = super().adapter_state(model_id)
        gathered: list[Any] = [None] * self.ranks.world_size
        dist.all_gather_object(gathered, state)
        for rank, other in enumerate(gathered):
            if other.keys() != state.keys() or any(
                not torch.equal(other[k], state[k]) for k in state
            ):
                raise RuntimeError(
                    f"rank {rank}'s copy of {model_id}'s adapter differs from rank 0's"
                )
        return state

    def _write(self, tm: Any, kind: str, name: str, optimizer: bool) -> str:
        if self.ranks.is_main:
            return super()._write(tm, kind, name, optimizer)
        if not name or "/" in name:  # refused on every rank alike (rank 0's error is sent)
            raise RequestError(f"checkpoint name {name!r} must be non-empty and without '/'")
        return f"tinker://{tm.model_id}/{kind}/{name}"  # the same path; rank 0 writes it

    def _drop(self, path: str) -> None:
        if self.ranks.is_main:
            super()._drop(path)
        else:
            self._evict(path)


# --- the child ------------------------------------------------------------------------------


def _serve(conn: Connection) -> None:
    """A rank: join the group, load the engine, then run each request the server sends."""
    rank, world, address = (
        int(os.environ["RANK"]),
        int(os.environ["WORLD_SIZE"]),
        os.environ["ADDRESS"],
    )
    try:
        settings, state_dir, threads = _recv(conn)
        torch.set_num_threads(threads)
        engine = join_and_load(settings, Path(state_dir), rank, world, address)
        _send(conn, ("ok", describe(engine)))
    except BaseException as e:
        _reply_error(conn, e)
        return
    while True:
        try:
            method, args = _recv(conn)
        except EOFError:  # the server is gone
            break
        if method == "close":
            break
        try:
            out = run_method(engine, method, args)
            _send(conn, ("ok", out if rank == 0 else None))
        except BaseException as e:
            _reply_error(conn, e)
    with contextlib.suppress(Exception):
        leave_rank_group()


def join_and_load(
    settings: Any, state_dir: Path, rank: int, world: int, address: str
) -> RankEngine:
    """Join the group at `address` as `rank` and load this rank's engine (a child process's
    or a Ray actor's)."""
    device = torch.device(settings.device)
    init_rank_group(rank, world, address, device=device, timeout_s=START_TIMEOUT_S)
    if device.type == "cuda":  # one GPU per rank: the group set this rank's (LOCAL_RANK)
        settings = dataclasses.replace(settings, device=f"cuda:{torch.cuda.current_device()}")
    engine = _load(settings, state_dir, Ranks(rank, world, settings.parallel))
    set_collective_timeout(settings.collective_timeout_s)
    return engine


def _load(settings: Any, state_dir: Path, ranks: Ranks) -> RankEngine:
    from agentrl.models import load_model

    model, tokenizer = load_model(settings.base_model, settings.dtype, device=settings.device)
    for p in model.parameters():
        p.requires_grad_(False)  # the base is frozen: FSDP reduces no gradient of it
    model = Strategy(ranks, torch.device(settings.device), bf16=False).wrap(model)
    return RankEngine(
        settings.base_model, model, tokenizer, state_dir, settings.device, ranks=ranks
    )


def _send(conn: Connection, obj: Any) -> None:
    # plain pickle: Connection.send would pass tensors by shared-memory handle, which needs
    # a multiprocessing authkey these (non-multiprocessing) children do not share
    conn.send_bytes(pickle.dumps(obj))


def _recv(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def _reply_error(conn: Connection, e: BaseException) -> None:
    try:
        _send(conn, ("error", e))
    except Exception:  # the exception does not pickle
        _send(conn, ("error", RuntimeError(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")))


# --- the server's side ------------------------------------------------------------------------


class _Group:
    """The child processes and the pipes to them; a call goes to every rank."""

    def __init__(self, settings: Any, state_dir: Path) -> None:
        from agentrl.run.placement.learner_process import free_port

        self.world = settings.world_size
        address = f"tcp://127.0.0.1:{free_port()}"
        root = str(Path(__file__).resolve().parents[3])  # where `agentrl` imports from
        threads = max(1, torch.get_num_threads() // self.world)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.conns: list[Connection] = []
        for rank in range(self.world):
            mine, theirs = socket.socketpair()
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(self.world), ADDRESS=address)
            env["LOCAL_RANK"] = str(rank)  # one GPU per rank (torch.cuda.set_device)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "agentrl.run.tinker.ranks", str(theirs.fileno())],
                    pass_fds=[theirs.fileno()],
                    env=env,
                )
            )
            theirs.close()
            conn = Connection(mine.detach())
            _send(conn, (settings, str(state_dir), threads))
            self.conns.append(conn)
        self.info = self._replies("starting", START_TIMEOUT_S)

    def _replies(self, doing: str, timeout: float | None = None) -> Any:
        """Rank 0's reply once every rank answered; the first error raised."""
        replies: dict[int, Any] = {}
        waiting = dict(enumerate(self.conns))
        while waiting:
            ready = wait(list(waiting.values()), timeout)
            if not ready:
                self.close()
                raise RuntimeError(
                    f"the Tinker engine's ranks did not answer within {timeout:g} s while {doing}"
                )
            for rank, conn in list(waiting.items()):
                if conn not in ready:
                    continue
                del waiting[rank]
                try:
                    replies[rank] = _recv(conn)
                except (EOFError, OSError):
                    self.procs[rank].wait(timeout=5)
                    code = self.procs[rank].returncode
                    self.close()
                    raise RuntimeError(
                        f"Tinker engine rank {rank} died while {doing} (exit {code}); restart "
                        "agentrl serve --tinker (saved checkpoints are intact)"
                    ) from None
        for rank in sorted(replies):
            kind, payload = replies[rank]
            if kind == "error":
                raise payload
        return replies[0][1]

    def call(self, method: str, *args: Any) -> Any:
        for conn in self.conns:
            _send(conn, (method, args))
        return self._replies(f"running {method}")

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                _send(conn, ("close", ()))
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.conns = []


class RankEngineProxy(RemoteEngine):
    """A RemoteEngine that fixes what every rank must draw alike: a new adapter's seed and
    each decode batch's."""

    def create_model(self, model_id: str, spec: Any) -> dict[str, Any]:
        if spec.seed is None:
            spec = dataclasses.replace(spec, seed=secrets.randbits(31))
        return super().create_model(model_id, spec)

    def sample_batch(self, jobs: list[Any]) -> list[Any]:
        sent = [
            (path, dataclasses.replace(r, params=dataclasses.replace(r.params, decode_text=None)))
            for path, r in jobs
        ]
        return self._call("sample_batch", sent, secrets.randbits(63))


def start_rank_engine(settings: Any, state_dir: Path) -> RemoteEngine:
    """``settings.world_size`` ranks on this machine, and the proxy the server holds."""
    from agentrl.models import load_tokenizer

    group = _Group(settings, Path(state_dir).resolve())
    where = (
        f"{settings.world_size} ranks ({settings.parallel}), pids {[p.pid for p in group.procs]}"
    )
    tokenizer = load_tokenizer(settings.base_model)
    pids = [p.pid for p in group.procs]
    return RankEngineProxy(group.call, group.info, tokenizer, state_dir, group.close, where, pids)


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])))
