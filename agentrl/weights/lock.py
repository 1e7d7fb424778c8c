"""A lock over weights that two processes compute on, with the version they hold.

When the learner process's parameters *are* the shared-memory buffers
(:func:`agentrl.weights.shared.adopt`) and the hf sampler in the parent computes on views of
the same buffers (``learner.share_weights``), the only moment the weights change is the
learner's optimizer step. :class:`WeightLock` keeps a forward pass off half-updated weights:

* the learner writes under :meth:`WeightLock.writing` (the optimizer step, a checkpoint
  load), which also records the version the weights hold afterwards;
* the sampler holds the lock (``with lock:``) for each of its iterations and reads
  :attr:`WeightLock.version` there, so every token is tagged with the version of the
  weights that produced it, before the orchestrator's publish arrives.

The lock is ``flock`` on a small file in the shared-memory folder: the kernel releases it
when a holder dies, so a killed learner never leaves the sampler blocked. The file also
holds the version and a "writer waiting" flag, which a reader honours before it takes the
lock, so a sampler that takes the lock back to back cannot starve the learner.

    lock = WeightLock.create()                    # owner (learner process)
    with lock.writing(version + 1): optimizer.step()
    other = WeightLock.attach(lock.handle())      # the other process; unlinks the file
    with other: forward(); other.version
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from types import TracebackType

from agentrl.weights.files import shm_root

VERSION, WRITER_WAITING = 0, 1  # int64 slots in the file
# longest a reader defers to a waiting writer; a writer waits at most one reader iteration,
# so past this it died between raising the flag and taking the lock (the flag is cleared)
WRITER_WAIT_S = 5.0


class WeightLock:
    """See the module docstring. One per process (each opens the file itself: ``flock``
    excludes open files); threads of a process are excluded by a lock of its own."""

    def __init__(self, path: str, *, owner: bool) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, 16)
        self._slots = memoryview(self._map).cast("q")
        self._owner = owner
        self._threads = threading.Lock()  # flock does not exclude threads of one process

    @classmethod
    def create(cls, version: int = 0) -> WeightLock:
        fd, path = tempfile.mkstemp(prefix="agentrl-learner-lock-", dir=shm_root())
        os.ftruncate(fd, 16)
        os.close(fd)
        lock = cls(path, owner=True)
        lock._slots[VERSION] = version
        return lock

    @classmethod
    def attach(cls, path: str) -> WeightLock:
        """Open the owner's lock and unlink its file (the open file stays valid), so
        nothing is left in the shared-memory folder however either process ends."""
        lock = cls(path, owner=False)
        with contextlib.suppress(OSError):
            os.unlink(path)
        return lock

    def handle(self) -> str:
        return self.path

    @property
    def version(self) -> int:
        """The version the weights held when the lock was last released by a writer."""
        return int(self._slots[VERSION])

    # --- the reader (the sampler, one iteration at a time) ----------------------------------

    def __enter__(self) -> WeightLock:
        self._threads.acquire()
        deadline = time.monotonic() + WRITER_WAIT_S
        while self._slots[WRITER_WAITING]:
            if time.monotonic() > deadline:  # a writer that died waiting: clear its flag
                self._slots[WRITER_WAITING] = 0
                break
            time.sleep(0.0005)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._threads.release()

    # --- the writer (the learner) -------------------------------------------------------------

    @contextlib.contextmanager
    def writing(self, version: int) -> Iterator[None]:
        """Hold the lock while the weights change; they hold `version` once the block
        returns (a block that raises leaves the recorded version as it was)."""
        with self._threads:
            self._slots[WRITER_WAITING] = 1
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            finally:
                self._slots[WRITER_WAITING] = 0
            try:
                yield
                self._slots[VERSION] = version
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def __del__(self) -> None:
        if hasattr(self, "_fd"):  # not when the file could not be opened
            self.close()

    def close(self) -> None:
        """Close this process's handle (the owner also removes the file if the other
        process never attached)."""
        if self._fd < 0:
            return
        if self._owner:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        with contextlib.suppress(Exception):
            self._slots.release()
            self._map.close()
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._fd = -1
