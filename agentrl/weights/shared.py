"""A state dict in flat shared buffers, one per dtype, seen by several processes.

The learner process (:mod:`agentrl.run.placement.learner_process`) owns a :class:`SharedWeights` and
refreshes it after every step; the parent maps the same files with :func:`map_file` and
reads the weights through :func:`views` without a copy. Entries that share storage (tied
embeddings) share one slot.

    shared = SharedWeights(model)                 # child: files in shm_root()
    buffers = {dt: map_file(path, dt, n) for dt, (path, n) in shared.files.items()}
    weights = views(buffers, shared.slots)        # parent: name -> tensor view

Two kinds, picked by :func:`agentrl.devices.sharing_kind` from ``learner.weight_sharing`` and the learner's
device, behind one pair of calls (:func:`share_weights` in the owner, :func:`attach` in
the other process): ``shared_memory`` (the files above; a CUDA learner's weights go
through host memory) and ``cuda_ipc`` (:class:`CudaSharedWeights`: the buffers stay on the
GPU and the other process opens them by CUDA IPC handle, which torch.multiprocessing's
pickler sends over the learner's pipe, so a sampler on a GPU copies device to device).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
import threading
import weakref
from collections.abc import Mapping
from typing import Any

import torch
import torch.multiprocessing  # registers the IPC pickling of CUDA tensors
from torch import Tensor

from agentrl.errors import WeightUpdateError
from agentrl.weights.files import shm_root

# name -> (dtype, offset in that dtype's buffer, shape)
Slot = tuple[torch.dtype, int, tuple[int, ...]]


def layout(
    state: Mapping[str, Tensor], dtype: torch.dtype | None = None
) -> tuple[dict[torch.dtype, int], dict[str, Slot]]:
    """Elements per dtype buffer, and each name's slot; tied entries share a slot. With
    `dtype`, floating-point entries are kept in it (the refresh casts)."""
    sizes: dict[torch.dtype, int] = {}
    seen: dict[tuple[int, torch.dtype, tuple[int, ...]], Slot] = {}
    slots: dict[str, Slot] = {}
    for name, t in state.items():
        key = (t.data_ptr(), t.dtype, tuple(t.shape))
        if key not in seen:
            dt = dtype if dtype is not None and t.is_floating_point() else t.dtype
            off = sizes.get(dt, 0)
            seen[key] = (dt, off, tuple(t.shape))
            sizes[dt] = off + t.numel()
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


# this process's mappings of shared files (a handful: one per dtype buffer): start address ->
# (bytes, the mapping); weak, so a mapping goes with the last tensor over it
_MAPPED: dict[int, tuple[int, weakref.ref[mmap.mmap]]] = {}
_MAPPED_LOCK = threading.Lock()


def map_file(path: str, dtype: torch.dtype, numel: int) -> Tensor:
    """A tensor over the file at `path`, shared (writes reach every process mapping it); the
    file grows to `numel` elements if it is shorter."""
    nbytes = numel * dtype.itemsize
    if nbytes == 0:
        return torch.empty(0, dtype=dtype)
    with open(path, "r+b") as f:
        if os.fstat(f.fileno()).st_size < nbytes:
            os.ftruncate(f.fileno(), nbytes)
        mapping = mmap.mmap(f.fileno(), nbytes, flags=mmap.MAP_SHARED)
    tensor = torch.frombuffer(mapping, dtype=dtype, count=numel)  # holds the mapping
    with _MAPPED_LOCK:
        for start in [a for a, (_, ref) in _MAPPED.items() if ref() is None]:
            del _MAPPED[start]
        _MAPPED[tensor.data_ptr()] = (nbytes, weakref.ref(mapping))
    return tensor


def drop_pages(tensor: Tensor) -> bool:
    """Let this process's page-table entries for `tensor`'s bytes go, when they lie in a
    shared file :func:`map_file` mapped here; returns whether they did.

    The bytes stay in the file (and in every other process mapping it); the next read here
    maps them again, a minor fault per page. For a process that only copies out of the
    owner's buffers (a sampler taking a publish): without this, every page it has read
    stays in its resident set, so the learner's weights count in both processes' RSS.
    Measured on 513 MB: the next copy takes 77 instead of 30 ms, and RSS falls by 513 MB."""
    if tensor.device.type != "cpu" or tensor.numel() == 0:
        return False
    first = tensor.data_ptr()
    last = first + tensor.numel() * tensor.element_size()  # contiguous extent, at most
    with _MAPPED_LOCK:
        found = [(b, n, r) for b, (n, r) in _MAPPED.items() if b <= first and last <= b + n]
    if not found:
        return False
    base, nbytes, ref = found[0]
    mapping = ref()
    if mapping is None:
        return False
    page = mmap.PAGESIZE
    start = (first - base) // page * page
    mapping.madvise(mmap.MADV_DONTNEED, start, min(nbytes, last - base) - start)
    return True


def _state(source: torch.nn.Module | Mapping[str, Tensor]) -> Mapping[str, Tensor]:
    return source.state_dict() if isinstance(source, torch.nn.Module) else source


def _check_space(nbytes: int) -> None:
    """Refuse buffers the shared-memory folder cannot hold: a file on a full tmpfs maps
    fine and then kills the process (SIGBUS) on first write. Containers often give
    /dev/shm 64 MB."""
    root = shm_root()
    st = os.statvfs(root)
    free = st.f_bavail * st.f_frsize
    if nbytes > free:
        raise WeightUpdateError(
            f"sharing the learner's weights needs {nbytes / 2**20:.0f} MB in {root} but it has "
            f"{free / 2**20:.0f} MB free: enlarge it (docker run --shm-size=...), or with the "
            "learner on CUDA use learner.weight_sharing=cuda_ipc (no files), or train in this "
            "process (orchestrator.learner_worker=thread)"
        )


class SharedWeights:
    """The owner's side: flat buffers in shared-memory files mirroring `model`'s state dict
    (a module or a state dict).

    ``files`` (dtype -> (path, elements)) and ``slots`` are what another process needs to
    map them. That process should unlink the files once it has mapped them (the mappings
    stay valid), so nothing is left in /dev/shm however either process ends afterwards;
    :meth:`unlink` covers the case where it never got that far.
    """

    kind = "shared_memory"

    def __init__(
        self, model: torch.nn.Module | Mapping[str, Tensor], dtype: torch.dtype | None = None
    ) -> None:
        state = _state(model)
        sizes, self.slots = layout(state, dtype)
        _check_space(sum(n * dt.itemsize for dt, n in sizes.items()))
        self.files: dict[torch.dtype, tuple[str, int]] = {}
        self.buffers: dict[torch.dtype, Tensor] = {}
        for dt, n in sizes.items():
            fd, path = tempfile.mkstemp(prefix="agentrl-learner-", dir=shm_root())
            os.close(fd)
            self.files[dt] = (path, n)
            self.buffers[dt] = map_file(path, dt, n)
        self.views = views(self.buffers, self.slots)
        self.refresh(model)

    def refresh(self, model: torch.nn.Module | Mapping[str, Tensor]) -> None:
        """Copy `model`'s current weights into the buffers (entries that already live in
        them, see :func:`adopt`, are skipped)."""
        with torch.no_grad():
            for name, t in _state(model).items():
                view = self.views[name]
                if t.data_ptr() != view.data_ptr():
                    view.copy_(t.detach())

    def handle(self) -> tuple[str, Any, dict[str, Slot]]:
        """What another process needs to :func:`attach` (picklable)."""
        return self.kind, self.files, self.slots

    def unlink(self) -> None:
        for path, _ in self.files.values():
            with contextlib.suppress(OSError):
                os.unlink(path)


class CudaSharedWeights:
    """The owner's side on a GPU: flat device buffers mirroring a state dict; their
    :meth:`handle` pickles (through torch.multiprocessing's reductions) as CUDA IPC handles,
    so another process maps the same device memory. The owner keeps the buffers alive."""

    kind = "cuda_ipc"

    def __init__(self, state: Mapping[str, Tensor], dtype: torch.dtype | None = None) -> None:
        state = _state(state)
        sizes, self.slots = layout(state, dtype)
        self.device = next(iter(state.values())).device
        self.buffers = {dt: torch.empty(n, dtype=dt, device=self.device) for dt, n in sizes.items()}
        self.views = views(self.buffers, self.slots)
        self.refresh(state)

    def refresh(self, state: torch.nn.Module | Mapping[str, Tensor]) -> None:
        """Copy the current weights in on the device; returns once the copy is done, so the
        other process reads whole weights as soon as it hears back."""
        with torch.no_grad():
            for name, t in _state(state).items():
                self.views[name].copy_(t.detach())
        torch.cuda.synchronize(self.device)

    def handle(self) -> tuple[str, Any, dict[str, Slot]]:
        return self.kind, self.buffers, self.slots

    def unlink(self) -> None:
        """Nothing on disk: the buffers go with this process."""


def adopt(model: torch.nn.Module, shared: SharedWeights | CudaSharedWeights) -> bool:
    """Make `model`'s parameters live in `shared`'s buffers (each becomes a view of its slot,
    holding the same values), so the owner's weights are not kept twice and a refresh
    copies nothing; the other process's views then see every change as it is made (read
    them only between the owner's steps: a publish copies them before the next step).

    Only when every parameter has a slot of its own dtype, shape and device (the state was
    the parameters themselves, not LoRA-merged or cast copies); returns whether it did.
    The parameters keep their identity (an optimizer's state stays attached)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    for name, p in params.items():
        view = shared.views.get(name)
        if view is None or (view.dtype, view.shape, view.device) != (p.dtype, p.shape, p.device):
            return False
    with torch.no_grad():
        for name, p in params.items():
            view = shared.views[name]
            if p.data_ptr() != view.data_ptr():  # a tied parameter is met twice
                view.copy_(p)
                p.data = view
    return True


def share_weights(
    state: Mapping[str, Tensor], kind: str, dtype: torch.dtype | None = None
) -> SharedWeights | CudaSharedWeights:
    """The owner's side of `kind` (from :func:`agentrl.devices.sharing_kind`) for `state`, its floating-point
    entries in `dtype` when given."""
    if kind == "cuda_ipc":
        return CudaSharedWeights(state, dtype)
    return SharedWeights(state, dtype)


def attach(handle: tuple[str, Any, dict[str, Slot]]) -> dict[str, Tensor]:
    """The other process's side: name -> a view of the owner's buffers (no copy). Shared
    memory files are unlinked once mapped (the mapping stays valid)."""
    kind, payload, slots = handle
    if kind == "cuda_ipc":
        buffers = payload  # unpickled from IPC handles: the owner's device memory
    else:
        buffers = {}
        for dt, (path, n) in payload.items():
            buffers[dt] = map_file(path, dt, n)
            with contextlib.suppress(OSError):
                os.unlink(path)
    return views(buffers, slots)
