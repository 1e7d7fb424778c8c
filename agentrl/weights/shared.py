"""A state dict in flat shared-memory buffers, one per dtype, mapped by several processes.

The learner process (:mod:`agentrl.learner.worker`) owns a :class:`SharedWeights` and
refreshes it after every step; the parent maps the same files with :func:`map_file` and
reads the weights through :func:`views` without a copy. Entries that share storage (tied
embeddings) share one slot.

    shared = SharedWeights(model)                 # child: files in shm_root()
    buffers = {dt: map_file(path, dt, n) for dt, (path, n) in shared.files.items()}
    weights = views(buffers, shared.slots)        # parent: name -> tensor view
"""

from __future__ import annotations

import contextlib
import os
import tempfile

import torch
from torch import Tensor

from agentrl.weights.files import shm_root

# name -> (dtype, offset in that dtype's buffer, shape)
Slot = tuple[torch.dtype, int, tuple[int, ...]]


def layout(state: dict[str, Tensor]) -> tuple[dict[torch.dtype, int], dict[str, Slot]]:
    """Elements per dtype buffer, and each name's slot; tied entries share a slot."""
    sizes: dict[torch.dtype, int] = {}
    seen: dict[tuple[int, torch.dtype, tuple[int, ...]], Slot] = {}
    slots: dict[str, Slot] = {}
    for name, t in state.items():
        key = (t.data_ptr(), t.dtype, tuple(t.shape))
        if key not in seen:
            off = sizes.get(t.dtype, 0)
            seen[key] = (t.dtype, off, tuple(t.shape))
            sizes[t.dtype] = off + t.numel()
        slots[name] = seen[key]
    return sizes, slots


def views(buffers: dict[torch.dtype, Tensor], slots: dict[str, Slot]) -> dict[str, Tensor]:
    """name -> a view of its slot in `buffers` (no copy)."""
    out = {}
    for name, (dtype, off, shape) in slots.items():
        n = 1
        for d in shape:
            n *= d
        out[name] = buffers[dtype][off : off + n].view(shape)
    return out


def map_file(path: str, dtype: torch.dtype, numel: int) -> Tensor:
    """A tensor over the file at `path`, shared (writes reach every process mapping it)."""
    return torch.from_file(path, shared=True, size=numel, dtype=dtype)


class SharedWeights:
    """The owner's side: flat buffers in shared-memory files mirroring `model`'s state dict.

    ``files`` (dtype -> (path, elements)) and ``slots`` are what another process needs to
    map them. That process should unlink the files once it has mapped them (the mappings
    stay valid), so nothing is left in /dev/shm however either process ends afterwards;
    :meth:`unlink` covers the case where it never got that far.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        state = model.state_dict()
        sizes, self.slots = layout(state)
        self.files: dict[torch.dtype, tuple[str, int]] = {}
        self.buffers: dict[torch.dtype, Tensor] = {}
        for dt, n in sizes.items():
            fd, path = tempfile.mkstemp(prefix="agentrl-learner-", dir=shm_root())
            os.close(fd)
            self.files[dt] = (path, n)
            self.buffers[dt] = map_file(path, dt, n)
        self.views = views(self.buffers, self.slots)
        self.refresh(model)

    def refresh(self, model: torch.nn.Module) -> None:
        """Copy `model`'s current weights into the buffers."""
        with torch.no_grad():
            for name, t in model.state_dict().items():
                self.views[name].copy_(t.detach())

    def unlink(self) -> None:
        for path, _ in self.files.values():
            with contextlib.suppress(OSError):
                os.unlink(path)
