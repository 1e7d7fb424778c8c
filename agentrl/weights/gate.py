"""A gate between the learner's weight writes and a sampler's forward passes.

An asynchronous run's hf sampler may compute on the learner's own float32 tensors instead
of a copy of them (``sampler.share_learner_weights``; docs/architecture.md, "Data flow", Weights):
one copy of the weights in memory, nothing copied on a publish. The learner then changes
the tensors while the sampler generates, so the two take turns on them: the learner's
optimizer step is a *write* and each forward pass of the sampler (a prefill chunk, a decode
step) a *read*. A forward pass sees one optimizer step's weights, never a half-updated
tensor; in-flight rows go on with the new weights at the next pass, as with
``sampler.on_update: keep``. The gate carries the weights' version too (the step's last
optimizer update writes ``version + 1``; a read gets it), so every token is tagged with the
weights that produced it before the publish of that version reaches the sampler.

A writer that waits goes first: it takes the *turn* lock and then the *data* lock, and a
reader passes the turn lock before it takes the data lock, so a sampler that decodes step
after step cannot keep the learner out (nor the learner the sampler, which waits for one
optimizer step at a time).

Two kinds, one interface:

- :class:`ThreadGate`: the learner trains in the sampler's process (``learner_worker:
  thread``): ``threading`` locks.
- :class:`FileGate`: the learner trains in its own process and its parameters live in the
  shared-memory buffers the sampler maps (:func:`~agentrl.weights.shared.adopt`): ``flock``
  on two files. The kernel drops a dead process's locks, so a learner that crashes inside an
  optimizer step does not leave the sampler waiting.

    gate = FileGate.create()                    # the learner process
    learner.use_weight_gate(gate)               # around optimizer.step()
    reader = FileGate.open(gate.handle())       # the sampler's process
    with reader.reading():
        logits = model(...)
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Protocol

from agentrl.weights.files import shm_root

VERSION_BYTES = 8  # an int64 at the start of the data file


class _Lock(Protocol):
    def acquire(self) -> object: ...
    def release(self) -> None: ...


class _FileLock:
    """An exclusive ``flock`` on a file this process opened itself. ``flock`` excludes open
    files, not threads (two threads of a process share this one), so a thread lock is taken
    first."""

    def __init__(self, path: str, *, create: bool) -> None:
        self.path = path
        self._fd = -1
        self._threads = threading.Lock()
        # the other side opens the owner's file, never a new one of the same name
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        try:
            self._fd = os.open(path, flags, 0o600)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"the learner's weight gate {path} is gone (the learner process exited?)"
            ) from None

    def acquire(self) -> None:
        self._threads.acquire()
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise

    def release(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._threads.release()

    @property
    def fd(self) -> int:
        return self._fd

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        self.close()


class WeightGate:
    """Writes (the learner's optimizer steps) and reads (the sampler's forward passes) of
    shared weights, one at a time, a waiting writer first. Counts the time each side waited
    (``write_wait_s``, ``read_wait_s``) and the writes (``writes``).

    The gate also carries the weights' version: a write may say which version the weights
    are once it is done (the learner's last optimizer step of a step: ``version + 1``), and
    a read gets the version of the weights it computes on, so every token is tagged with the
    weights that produced it. Weights between two versions (the earlier optimizer steps of a
    step with several: ``ppo_epochs`` / ``minibatches`` > 1) keep the older one."""

    def __init__(self, turn: _Lock, data: _Lock) -> None:
        self._turn, self._data = turn, data
        self.writes = 0
        self.write_wait_s = 0.0
        self.read_wait_s = 0.0

    @property
    def version(self) -> int:
        """The version last written (read it inside :meth:`reading` to match the weights)."""
        return self._load_version()

    @contextlib.contextmanager
    def writing(self, version: int | None = None) -> Iterator[None]:
        """The weights change inside; with `version`, they are that version once the body
        has returned (not if it raised)."""
        t0 = time.perf_counter()
        self._turn.acquire()  # readers arriving from now on wait behind this write
        try:
            self._data.acquire()  # the forward pass under way ends first
            self.write_wait_s += time.perf_counter() - t0
            try:
                yield
                if version is not None:
                    self._store_version(version)
            finally:
                self.writes += 1
                self._data.release()
        finally:
            self._turn.release()

    @contextlib.contextmanager
    def reading(self) -> Iterator[int]:
        """A forward pass; yields the version of the weights it sees."""
        t0 = time.perf_counter()
        self._turn.acquire()  # behind a writer that is waiting or writing
        self._turn.release()
        self._data.acquire()
        self.read_wait_s += time.perf_counter() - t0
        try:
            yield self._load_version()
        finally:
            self._data.release()

    def _load_version(self) -> int:
        raise NotImplementedError

    def _store_version(self, version: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Let go of what this side opened (nothing for threads)."""


class ThreadGate(WeightGate):
    """A gate between two threads of one process."""

    def __init__(self, version: int = 0) -> None:
        super().__init__(threading.Lock(), threading.Lock())
        self._version = version

    def _load_version(self) -> int:
        return self._version

    def _store_version(self, version: int) -> None:
        self._version = version


class FileGate(WeightGate):
    """A gate between two processes: ``flock`` on two files in the shared-memory folder.
    The owner creates them (:meth:`create`); the other process opens them by
    :meth:`handle` (:meth:`open`) and then removes them (:meth:`unlink`)."""

    def __init__(self, turn_path: str, data_path: str, *, owner: bool) -> None:
        self._turn_file = _FileLock(turn_path, create=owner)
        self._data_file = _FileLock(data_path, create=owner)
        super().__init__(self._turn_file, self._data_file)
        if owner:
            os.ftruncate(self._data_file.fd, VERSION_BYTES)
        # the version lives in the data file's first 8 bytes, written and read under its lock
        self._map = mmap.mmap(self._data_file.fd, VERSION_BYTES)

    @classmethod
    def create(cls, root: str | os.PathLike[str] | None = None, version: int = 0) -> FileGate:
        folder = str(root if root is not None else shm_root())
        fd, turn = tempfile.mkstemp(prefix="agentrl-gate-", suffix=".turn", dir=folder)
        os.close(fd)
        data = turn[: -len(".turn")] + ".data"
        gate = cls(turn, data, owner=True)
        gate._store_version(version)  # no reader yet
        return gate

    def _load_version(self) -> int:
        return int(struct.unpack_from("<q", self._map, 0)[0])

    def _store_version(self, version: int) -> None:
        struct.pack_into("<q", self._map, 0, version)

    @classmethod
    def open(cls, handle: tuple[str, str]) -> FileGate:
        turn, data = handle
        return cls(turn, data, owner=False)

    def handle(self) -> tuple[str, str]:
        return (self._turn_file.path, self._data_file.path)

    def unlink(self) -> None:
        """Remove the files; both sides' open descriptors keep working (the other process
        unlinks them once it has opened them, as with the weights' own files)."""
        for path in self.handle():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):
            self._map.close()
        self._turn_file.close()
        self._data_file.close()
