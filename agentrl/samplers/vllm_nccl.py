"""Send weights to an in-process vLLM engine over NCCL (CUDA only).

UNTESTED in this repository's CI (no GPU): written against vLLM 0.32's NCCL
weight-transfer engine (``vllm.distributed.weight_transfer.nccl_engine``). The vllm
sampler uses it when ``weight_transport`` is ``"nccl"`` (or ``"auto"`` on CUDA).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator, Mapping
from typing import Any


class NcclWeightSender:
    """Trainer side of vLLM's NCCL weight-transfer engine, driven from this process.

    UNTESTED in this repository's CI (no GPU). This process is NCCL rank 0 (the sender) and
    the engine's worker(s) join as ranks 1..N; ``send`` broadcasts a state dict of CUDA
    tensors. Runs in a worker thread; calls back into the event loop for the engine RPCs.
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.loop = asyncio.get_running_loop()
        self.trainer: Any = None
        self.source = _DictSource()

    def init(self) -> None:
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerInitInfo,
            NCCLTrainerWeightTransferEngine,
        )

        world = 1 + int(self.engine.vllm_config.parallel_config.world_size)
        info = NCCLTrainerInitInfo(
            master_address="127.0.0.1", master_port=_free_port(), world_size=world, rank=0
        )
        self.trainer = NCCLTrainerWeightTransferEngine.trainer_init(
            info, client=_LoopClient(self.engine, self.loop), source=self.source
        )

    def send(self, tensors: Mapping[str, Any]) -> None:
        self.source.tensors = tensors
        self.trainer.send_weights()

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
