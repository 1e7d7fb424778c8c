"""Tinker's futures: every training or sampling call is queued and answered by request id.

A POST returns ``{"request_id": ...}`` at once; the work runs on the one worker thread in
arrival order (the SDK submits a training client's calls in its own order, one turn at a
time); ``retrieve_future`` waits up to :data:`LONG_POLL_S` for the result, then answers
``try_again`` so the SDK polls again. A failed call's result is ``{"error", "category"}``,
which the SDK raises as ``RequestFailedError`` with that message.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

LONG_POLL_S = 5.0
KEEP_RESULTS = 10_000  # finished results kept for retrieval (oldest dropped first)


@dataclass
class Result:
    ok: bool
    value: Any  # a JSON-able dict, protobuf bytes, or the error message
    user_error: bool = False


class Futures:
    """The queue, the worker thread and the results by request id."""

    def __init__(self, user_errors: tuple[type[BaseException], ...]) -> None:
        self.user_errors = user_errors
        self._jobs: queue.Queue[tuple[str, Callable[[], Any]] | None] = queue.Queue()
        self._results: dict[str, Result] = {}
        self._waiters: dict[str, asyncio.Future[None]] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.busy_s = 0.0
        self.done = 0
        self._thread = threading.Thread(target=self._run, name="tinker-worker", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any]) -> str:
        """Queue `fn`; its request id (the caller answers it to the SDK)."""
        request_id = uuid.uuid4().hex
        self._loop = asyncio.get_running_loop()
        with self._lock:
            self._waiters[request_id] = self._loop.create_future()
        self._jobs.put((request_id, fn))
        return request_id

    def known(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._waiters or request_id in self._results

    async def wait(self, request_id: str, timeout: float = LONG_POLL_S) -> Result | None:
        """The result, or None when it is not ready within `timeout` (answer try_again)."""
        with self._lock:
            result = self._results.get(request_id)
            waiter = self._waiters.get(request_id)
        if result is not None or waiter is None:
            return result
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except asyncio.TimeoutError:
            return None
        with self._lock:
            return self._results.get(request_id)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        import time

        while (job := self._jobs.get()) is not None:
            request_id, fn = job
            start = time.perf_counter()
            try:
                result = Result(True, fn())
            except self.user_errors as e:
                result = Result(False, str(e), user_error=True)
            except Exception as e:
                log.error("tinker request %s failed:\n%s", request_id, traceback.format_exc())
                result = Result(False, f"the server failed: {e!r}")
            self.busy_s += time.perf_counter() - start
            self.done += 1
            with self._lock:
                self._results[request_id] = result
                waiter = self._waiters.pop(request_id, None)
                while len(self._results) > KEEP_RESULTS:
                    self._results.pop(next(iter(self._results)))
            if waiter is not None and self._loop is not None:
                self._loop.call_soon_threadsafe(_resolve, waiter)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
