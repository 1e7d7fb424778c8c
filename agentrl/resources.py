"""Scoped resources: one structured lifetime for what a run (or an episode) opens.

    async with ResourceScope("run") as run, run.active():
        ...                                   # tools started here find the run's scope
        sandbox = await run.get_or_create("python.sandbox", open_sandbox)

A scope is an exit stack with a keyed cache in front: the first ``get_or_create(key, f)``
calls ``f(stack)``, which opens the resource and registers its closing on ``stack``;
later calls get the same object; :meth:`ResourceScope.aclose` closes everything in reverse
order on every exit path. Entry points (``agentrl train``, ``rollout``, ``eval``) open one
run scope and make it the :func:`current_run_scope` while they run, so tools share run-wide
resources (a sandbox pool, a search index) without module globals and without the loop
knowing which tools exist. Depends on nothing else of ours.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from contextvars import ContextVar
from typing import Any, TypeVar

import anyio

T = TypeVar("T")
Factory = Callable[[AsyncExitStack], Awaitable[T]]

_run_scope: ContextVar[ResourceScope | None] = ContextVar("agentrl_run_scope", default=None)


class ResourceScope:
    """Keyed resources opened once and closed together, in reverse order."""

    def __init__(self, name: str = "scope") -> None:
        self.name = name
        self._stack = AsyncExitStack()
        self._resources: dict[str, Any] = {}
        self._creating: dict[str, anyio.Lock] = {}
        self.closed = False

    def __contains__(self, key: object) -> bool:
        return key in self._resources

    async def get_or_create(self, key: str, factory: Factory[T]) -> T:
        """The resource under `key`, created by ``factory(exit_stack)`` on first use.

        Concurrent first calls for one key wait for a single creation."""
        if self.closed:
            raise RuntimeError(f"the {self.name} scope is closed; {key!r} cannot be opened")
        if key in self._resources:
            return self._resources[key]
        lock = self._creating.setdefault(key, anyio.Lock())
        async with lock:
            if key not in self._resources:
                self._resources[key] = await factory(self._stack)
        return self._resources[key]

    def discard(self, key: str) -> None:
        """Forget `key` (its closing stays registered): the next use creates a new one."""
        self._resources.pop(key, None)

    def push(self, close: Callable[[], Awaitable[Any]]) -> None:
        """Register an async close callback run when the scope closes."""
        self._stack.push_async_callback(close)

    async def aclose(self) -> None:
        self.closed = True
        self._resources.clear()
        with anyio.CancelScope(shield=True):  # closing finishes even while cancelled
            await self._stack.aclose()

    async def __aenter__(self) -> ResourceScope:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @contextlib.contextmanager
    def active(self) -> Iterator[ResourceScope]:
        """Make this the run scope of the current context (and tasks started from it)."""
        token = _run_scope.set(self)
        try:
            yield self
        finally:
            _run_scope.reset(token)


def current_run_scope() -> ResourceScope | None:
    """The run scope of the entry point running this code, or None outside a run."""
    scope = _run_scope.get()
    return None if scope is None or scope.closed else scope
