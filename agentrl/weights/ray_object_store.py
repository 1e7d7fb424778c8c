"""Weights through the Ray object store: put once, every replica reads the same object.

    transport = RayObjectStoreTransport()              # in the process that publishes
    payload = await transport.prepare(3, state)         # one ray.put of the whole state
    state = await payload.fetch()                       # on a replica: arrays, no extra copy

The state travels as numpy arrays (pickle protocol 5 keeps them out of band), so a replica
on the publisher's node maps them from shared memory and a replica on another node pulls
them once per node. Tensors that share storage (tied embeddings) are sent once, under
their first name; :class:`~agentrl.weights.spec.WeightSpec` fills in the other name.
Dtypes numpy lacks (bfloat16) travel as same-width integers and are viewed back.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import torch

_NUMPY_LACKS = {torch.bfloat16: torch.int16}


@dataclass(frozen=True)
class ObjectStoreWeights:
    """A version's weights in the object store: small, picklable, sent to every replica."""

    version: int
    ref: Any  # ray.ObjectRef of {name: numpy array}
    dtypes: dict[str, str]  # names sent as integers -> their torch dtype
    nbytes: int

    async def fetch(self) -> dict[str, torch.Tensor]:
        """The state dict, as read-only views of the object (copy before writing)."""
        arrays = await self.ref
        with warnings.catch_warnings():  # read-only object-store memory; samplers copy it
            warnings.simplefilter("ignore", UserWarning)
            state = {name: torch.from_numpy(a) for name, a in arrays.items()}
        for name, dtype in self.dtypes.items():
            state[name] = state[name].view(getattr(torch, dtype))
        return state


def to_arrays(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, Any], dict[str, str]]:
    """{name: numpy array} with shared storage sent once, and the names sent as integers."""
    arrays: dict[str, Any] = {}
    dtypes: dict[str, str] = {}
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key in seen:
            continue
        seen.add(key)
        t = t.detach().cpu().contiguous()
        if t.dtype in _NUMPY_LACKS:
            dtypes[name] = str(t.dtype).removeprefix("torch.")
            t = t.view(_NUMPY_LACKS[t.dtype])
        arrays[name] = t.numpy()
    return arrays, dtypes


class RayObjectStoreTransport:
    """``prepare``: one ``ray.put`` per version; ``release``: drop older versions' refs."""

    name = "ray_object_store"

    def __init__(self) -> None:
        self._held: dict[int, ObjectStoreWeights] = {}

    async def prepare(self, version: int, state: Mapping[str, torch.Tensor]) -> Any:
        import ray

        def put() -> ObjectStoreWeights:
            arrays, dtypes = to_arrays(state)
            nbytes = sum(a.nbytes for a in arrays.values())
            return ObjectStoreWeights(version, ray.put(arrays), dtypes, nbytes)

        payload = await anyio.to_thread.run_sync(put)
        self._held[version] = payload
        return payload

    async def release(self, keep_version: int) -> None:
        for version in [v for v in self._held if v < keep_version]:
            del self._held[version]  # the last reference: the store frees the object


def _register() -> None:
    from agentrl.weights.bus import register_transport

    register_transport(RayObjectStoreTransport.name, RayObjectStoreTransport)


_register()
