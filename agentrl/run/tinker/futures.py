"""Tinker's futures: every training or sampling call is queued and answered by request id.

A POST returns ``{"request_id": ...}`` at once; the work runs on the one worker thread:
training calls one at a time in arrival order (the SDK submits a training client's calls in
its own order, one turn at a time), and every sampling request queued meanwhile together in
one batch (``batch``: a list of payloads in, a result or exception per payload out), taking
turns with the training calls. ``retrieve_future`` waits up to :data:`LONG_POLL_S` for the
result, then answers ``try_again`` so the SDK polls again. A failed call's result is ``{"error", "category"}``,
which the SDK raises as ``RequestFailedError`` with that message.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

LONG_POLL_S = 30.0  # under the SDK's 45 s read timeout; each try_again is a logged warning
KEEP_RESULTS = 10_000  # finished results kept for retrieval (oldest dropped first)
MAX_BATCH = 64  # sampling requests decoded together


@dataclass
class Result:
    ok: bool
    value: Any  # a JSON-able dict, protobuf bytes, or the error message
    user_error: bool = False


class Futures:
    """The queues, the worker thread and the results by request id."""

    def __init__(
        self,
        user_errors: tuple[type[BaseException], ...],
        batch: Callable[[list[Any]], Sequence[Any]] | None = None,
    ) -> None:
        self.user_errors = user_errors
        self.batch = batch
        self._calls: collections.deque[tuple[str, Callable[[], Any]]] = collections.deque()
        self._batched: collections.deque[tuple[str, Any]] = collections.deque()
        self._wake = threading.Condition()
        self._closed = False
        self._results: dict[str, Result] = {}
        self._waiters: dict[str, asyncio.Future[None]] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.busy_s = 0.0
        self.done = 0
        self.batches: list[int] = []  # the size of each sampling batch run
        self._thread = threading.Thread(target=self._run, name="tinker-worker", daemon=True)
        self._thread.start()

    def _register(self) -> str:
        request_id = uuid.uuid4().hex
        self._loop = asyncio.get_running_loop()
        with self._lock:
            self._waiters[request_id] = self._loop.create_future()
        return request_id

    def submit(self, fn: Callable[[], Any]) -> str:
        """Queue `fn`; its request id (the caller answers it to the SDK)."""
        return self._queue(self._calls, fn)

    def submit_batched(self, payload: Any) -> str:
        """Queue `payload` for the next batch run; its request id."""
        return self._queue(self._batched, payload)

    def _queue(self, queue: Any, item: Any) -> str:
        request_id = self._register()
        with self._wake:
            queue.append((request_id, item))
            self._wake.notify()
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
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout=30)

    def _outcome(self, fn: Callable[[], Any]) -> Result:
        try:
            return Result(True, fn())
        except self.user_errors as e:
            return Result(False, str(e), user_error=True)
        except Exception as e:
            log.error("tinker request failed:\n%s", traceback.format_exc())
            return Result(False, f"the server failed: {e!r}")

    def _run(self) -> None:
        sample_turn = True  # sampling batches and training calls take turns
        while True:
            with self._wake:
                while not self._closed and not self._calls and not self._batched:
                    self._wake.wait()
                if self._closed:
                    return
                if self._batched and (sample_turn or not self._calls):
                    n = min(len(self._batched), MAX_BATCH)
                    jobs = [self._batched.popleft() for _ in range(n)]
                    call = None
                else:
                    call, jobs = self._calls.popleft(), []
                sample_turn = call is not None
            start = time.perf_counter()
            if call is not None:
                finished = [(call[0], self._outcome(call[1]))]
            else:
                finished = self._run_batch(jobs)
                self.batches.append(len(jobs))
            self.busy_s += time.perf_counter() - start
            self.done += len(finished)
            for request_id, result in finished:
                self._finish(request_id, result)

    def _run_batch(self, jobs: list[tuple[str, Any]]) -> list[tuple[str, Result]]:
        assert self.batch is not None
        outcome = self._outcome(lambda: self.batch([payload for _, payload in jobs]))
        if not outcome.ok:  # the whole batch failed: each request gets the error
            return [(request_id, outcome) for request_id, _ in jobs]
        finished = []
        for (request_id, _), value in zip(jobs, outcome.value, strict=True):
            if isinstance(value, BaseException):
                result = self._outcome(lambda v=value: _raise(v))
            else:
                result = Result(True, value)
            finished.append((request_id, result))
        return finished

    def _finish(self, request_id: str, result: Result) -> None:
        with self._lock:
            self._results[request_id] = result
            waiter = self._waiters.pop(request_id, None)
            while len(self._results) > KEEP_RESULTS:
                self._results.pop(next(iter(self._results)))
        if waiter is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(_resolve, waiter)


def _raise(error: BaseException) -> Any:
    raise error


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
