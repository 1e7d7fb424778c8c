"""The weight bus: the learner publishes ``(version, weights)``, every sampler swaps to them.

    bus = WeightBus()
    bus.register(sampler)                       # any Sampler
    report = await bus.publish(3, model)        # a module or a state dict

Each sampler declares how it wants weights through its ``weight_payload`` attribute
(default ``"state_dict"``). The bus prepares each transport's payload once per version and
delivers to all samplers concurrently through ``sampler.update_weights(payload, version)``:

- ``state_dict``: the tensors themselves. The hf sampler copies them into its own
  parameters between two decode steps; the vllm sampler (which has no ``weight_payload``)
  stages or broadcasts them itself (shared-memory folder on CPU, NCCL on GPU).
- ``safetensors_dir``: a safetensors folder written once under ``<shm>/agentrl-weights/
  v<N>`` (``<shm>`` is :func:`~agentrl.weights.files.shm_root`: /dev/shm, else the temp
  folder) and shared by every sampler that asks for it (e.g. several vLLM-CPU engines: set ``sampler.weight_payload = "safetensors_dir"``);
  older versions are removed after delivery.

A new transport (NCCL broadcast, Ray object store) is a class with ``prepare`` and
``release`` registered with :func:`register_transport`; samplers and the learner stay
unchanged. Versions only go up.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
import torch

from agentrl._suggest import suggest
from agentrl.errors import UnknownNameError, WeightUpdateError
from agentrl.weights.files import shm_root, write_safetensors_dir


class WeightTransport(Protocol):
    """Turns a state dict into what a kind of sampler consumes, once per version."""

    name: str

    async def prepare(self, version: int, state: Mapping[str, torch.Tensor]) -> Any:
        """Return the payload handed to ``sampler.update_weights(payload, version)``."""
        ...

    async def release(self, keep_version: int) -> None:
        """Free payloads of versions older than `keep_version` (all samplers have moved on)."""
        ...


class StateDictTransport:
    """In-process: hand the tensors over; the sampler copies them into its own model."""

    name = "state_dict"

    async def prepare(self, version: int, state: Mapping[str, torch.Tensor]) -> Any:
        return state

    async def release(self, keep_version: int) -> None:
        return None


class SafetensorsDirTransport:
    """Write ``<root>/v<N>/model.safetensors`` once; samplers reload from the folder."""

    name = "safetensors_dir"

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root else shm_root() / "agentrl-weights"

    def folder(self, version: int) -> Path:
        return self.root / f"v{version}"

    async def prepare(self, version: int, state: Mapping[str, torch.Tensor]) -> Any:
        return await anyio.to_thread.run_sync(self._write, version, state)

    def _write(self, version: int, state: Mapping[str, torch.Tensor]) -> Path:
        return write_safetensors_dir(
            state, self.folder(version), metadata={"version": str(version)}
        )

    async def release(self, keep_version: int) -> None:
        def _clean() -> None:
            if not self.root.is_dir():
                return
            for folder in self.root.glob("v*"):
                with contextlib.suppress(ValueError):
                    if int(folder.name[1:]) < keep_version:
                        shutil.rmtree(folder, ignore_errors=True)

        await anyio.to_thread.run_sync(_clean)


_TRANSPORTS: dict[str, Callable[[], WeightTransport]] = {
    "state_dict": StateDictTransport,
    "safetensors_dir": SafetensorsDirTransport,
}


def register_transport(name: str, factory: Callable[[], WeightTransport]) -> None:
    """Make a transport available to samplers declaring ``weight_payload = name``."""
    _TRANSPORTS[name] = factory


@dataclass
class PublishReport:
    """Timings of one publish, in seconds."""

    version: int
    total_s: float
    bytes: int
    prepare_s: dict[str, float] = field(default_factory=dict)  # per transport
    deliver_s: dict[str, float] = field(default_factory=dict)  # per sampler (name#index)


class WeightBus:
    """Delivers new weights from the learner to every registered sampler."""

    def __init__(self, transports: Mapping[str, WeightTransport] | None = None) -> None:
        self._samplers: list[Any] = []
        self._transports: dict[str, WeightTransport] = dict(transports or {})
        self._version: int | None = None
        self._lock = anyio.Lock()

    @property
    def version(self) -> int | None:
        """The last version published, or None."""
        return self._version

    @property
    def samplers(self) -> list[Any]:
        return list(self._samplers)

    def register(self, sampler: Any) -> None:
        kind = getattr(sampler, "weight_payload", "state_dict")
        self._transport(kind)  # fail early on an unknown transport
        if sampler not in self._samplers:
            self._samplers.append(sampler)

    def unregister(self, sampler: Any) -> None:
        with contextlib.suppress(ValueError):
            self._samplers.remove(sampler)

    def _transport(self, kind: str) -> WeightTransport:
        if kind not in self._transports:
            if kind not in _TRANSPORTS:
                raise UnknownNameError(
                    f"unknown weight transport {kind!r} (declared by a sampler's "
                    f"weight_payload); known: {', '.join(_TRANSPORTS)}" + suggest(kind, _TRANSPORTS)
                )
            self._transports[kind] = _TRANSPORTS[kind]()
        return self._transports[kind]

    async def publish(
        self, version: int, weights: Mapping[str, torch.Tensor] | torch.nn.Module
    ) -> PublishReport:
        """Deliver `weights` tagged `version` to every sampler; returns when all have swapped.

        Every sampler is attempted even if one fails; then a :class:`WeightUpdateError`
        names the samplers that failed (they keep their previous version).
        """
        async with self._lock:
            if self._version is not None and version <= self._version:
                raise WeightUpdateError(
                    f"weight versions only go up: got {version} after {self._version}; "
                    f"publish {self._version + 1} or later"
                )
            started = time.perf_counter()
            state = _as_state_dict(weights)
            report = PublishReport(version=version, total_s=0.0, bytes=_nbytes(state))

            payloads: dict[str, Any] = {}
            for kind in dict.fromkeys(
                getattr(s, "weight_payload", "state_dict") for s in self._samplers
            ):
                t0 = time.perf_counter()
                payloads[kind] = await self._transport(kind).prepare(version, state)
                report.prepare_s[kind] = time.perf_counter() - t0

            errors: list[str] = []

            async def deliver(index: int, sampler: Any) -> None:
                kind = getattr(sampler, "weight_payload", "state_dict")
                label = f"{getattr(sampler, 'backend', type(sampler).__name__)}#{index}"
                t0 = time.perf_counter()
                try:
                    await sampler.update_weights(payloads[kind], version)
                except Exception as e:  # collected: the other samplers still get the update
                    errors.append(f"{label}: {type(e).__name__}: {e}")
                report.deliver_s[label] = time.perf_counter() - t0

            async with anyio.create_task_group() as tg:
                for index, sampler in enumerate(self._samplers):
                    tg.start_soon(deliver, index, sampler)

            self._version = version
            for kind in payloads:
                await self._transport(kind).release(version)
            report.total_s = time.perf_counter() - started
            if errors:
                raise WeightUpdateError(
                    f"publishing version {version} failed for " + "; ".join(errors)
                )
            return report


def _as_state_dict(
    weights: Mapping[str, torch.Tensor] | torch.nn.Module,
) -> dict[str, torch.Tensor]:
    if isinstance(weights, torch.nn.Module):
        weights = weights.state_dict()
    if not isinstance(weights, Mapping):
        raise WeightUpdateError(
            f"weights must be a torch module or a state dict (got {type(weights).__name__})"
        )
    return {name: t.detach() for name, t in weights.items()}


def _nbytes(state: Mapping[str, torch.Tensor]) -> int:
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in state.values():
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total
