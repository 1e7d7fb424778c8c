"""Waiting on events that live outside the test's process (a file written, a process gone).

A test that waits on something in its own process uses that thing's event, counter or
callback. One that waits on another process has no such hook, so it polls the observable
effect here; the timeout only bounds a hung run and is never the thing a test proves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# generous: the machine may be shared; reaching it means the awaited event never came
DEFAULT_TIMEOUT_S = 300.0


def wait_until(
    condition: Callable[[], T | bool | None],
    what: str,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.05,
    abort: Callable[[], str | None] | None = None,
) -> T:
    """Poll `condition` until it returns a true value, and return that value.

    `abort` is checked on every poll: a message from it (e.g. "the run exited early: ...")
    fails at once instead of waiting out the timeout. Raises AssertionError naming `what`.
    """
    deadline = time.monotonic() + timeout  # allow-clock: bounds a hang, proves nothing
    while True:
        value = condition()
        if value:
            return value  # type: ignore[return-value]
        if abort is not None and (message := abort()):
            raise AssertionError(f"while waiting for {what}: {message}")
        if time.monotonic() > deadline:  # allow-clock: bounds a hang, proves nothing
            raise AssertionError(f"{what}: not seen within {timeout:.0f} s")
        time.sleep(interval)  # allow-sleep: polling another process's observable effect


async def wait_until_async(
    condition: Callable[[], T | bool | None],
    what: str,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.01,
) -> T:
    """`wait_until` inside an event loop, for state that has no event of its own (a
    counter another task advances); the loop keeps running the tasks that advance it."""
    import anyio

    with anyio.move_on_after(timeout):
        while not (value := condition()):
            await anyio.sleep(interval)  # allow-sleep: polling a condition, yielding the loop
        return value  # type: ignore[return-value]
    raise AssertionError(f"{what}: not seen within {timeout:.0f} s")
