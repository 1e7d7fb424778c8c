"""Send weights to an in-process vLLM engine on CUDA: CUDA IPC when colocated, else NCCL.

Written against vLLM 0.32's weight-transfer engines
(``vllm.distributed.weight_transfer.ipc_engine`` / ``nccl_engine``); not run in this
repository's CI (no GPU with vLLM there). The vllm sampler picks the backend
(:func:`pick_transport`): ``ipc`` when the weights it is handed live on the GPU its one
worker runs on (the learner and vLLM colocated, the common single-node case: NCCL refuses
two ranks on one device, and IPC maps the learner's memory without a copy), ``nccl`` when
they are on another GPU or the engine has several workers.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator, Mapping
from typing import Any

TRANSPORTS = ("auto", "shm", "nccl", "ipc")


def pick_transport(requested: str, *, cuda: bool, learner_device: str | None, workers: int) -> str:
    """The transport for `requested` (one of :data:`TRANSPORTS`): ``auto`` is shared-memory
    files without CUDA, CUDA IPC when the learner's weights sit on the GPU of vLLM's single
    worker (this process's first visible GPU), else NCCL."""
    if requested not in TRANSPORTS:
        raise ValueError(
            f"weight_transport must be one of {', '.join(TRANSPORTS)} (got {requested!r})"
        )
    if requested != "auto":
        return requested
    if not cuda:
        return "shm"
    if learner_device in (None, "auto", "cuda", "cuda:0") and workers == 1:
        return "ipc"
    return "nccl"


class EngineWeightSender:
    """Trainer side of one of vLLM's weight-transfer engines, driven from this process.

    This process is the sender (rank 0); the engine's worker(s) receive. ``send`` ships a
    state dict of CUDA tensors as they are (IPC: handles to their memory; NCCL: one
    broadcast group formed at ``init``). Runs in a worker thread; the engine RPCs hop back
    onto the event loop.
    """

    def __init__(self, engine: Any, backend: str) -> None:
        if backend not in ("ipc", "nccl"):
            raise ValueError(f"vLLM weight transfer backend must be ipc or nccl (got {backend!r})")
        self.engine = engine
        self.backend = backend
        self.loop = asyncio.get_running_loop()
        self.trainer: Any = None
        self.source = _DictSource()

    def init(self) -> None:
        client = _LoopClient(self.engine, self.loop)
        if self.backend == "ipc":
            from vllm.distributed.weight_transfer.ipc_engine import (
                IPCTrainerInitInfo,
                IPCTrainerWeightTransferEngine,
            )

            self.trainer = IPCTrainerWeightTransferEngine.trainer_init(
                IPCTrainerInitInfo(rank=0), client=client, source=self.source
            )
            return
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerInitInfo,
            NCCLTrainerWeightTransferEngine,
        )

        world = 1 + int(self.engine.vllm_config.parallel_config.world_size)
        info = NCCLTrainerInitInfo(
            master_address="127.0.0.1", master_port=_free_port(), world_size=world, rank=0
        )
        self.trainer = NCCLTrainerWeightTransferEngine.trainer_init(
            info, client=client, source=self.source
        )

    def send(self, tensors: Mapping[str, Any]) -> None:
        self.source.tensors = tensors
        try:
            self.trainer.send_weights()
        finally:
            self.source.tensors = {}  # no reference to the learner's weights kept

    def shutdown(self) -> None:
        if self.trainer is not None:
            self.trainer.shutdown()


class _DictSource:
    """A ``vllm`` WeightSource over a plain state dict (duck-typed: metadata + iteration)."""

    def __init__(self) -> None:
        self.tensors: Mapping[str, Any] = {}

    def metadata(self) -> list[Any]:
        from vllm.distributed.weight_transfer.base import ParamMeta

        return [ParamMeta(k, v.dtype, tuple(v.shape)) for k, v in self.tensors.items()]

    def held_names(self) -> None:
        return None

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for k, v in self.tensors.items():
            yield k, v.detach().to("cuda").contiguous()


class _LoopClient:
    """``VLLMWeightSyncClient`` (sync) over an in-process ``AsyncLLM``, called from threads.

    vLLM calls these from its own helper threads, so they hop onto the event loop with
    ``asyncio.run_coroutine_threadsafe`` (the engine is asyncio-only anyway).
    """

    def __init__(self, engine: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.loop = loop

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        self._run(self.engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info)))

    def start_weight_update(self) -> None:
        self._run(self.engine.start_weight_update())

    def update_weights(self, update_info: Any) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        self._run(self.engine.update_weights(WeightTransferUpdateRequest(update_info)))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._run(self.engine.finish_weight_update())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
