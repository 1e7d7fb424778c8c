"""`Sandbox`: a bounded, warm pool of sandboxed interpreters; `Session`: one of them, kept
for an episode so state survives between calls.

    sb = create_sandbox()                       # returns at once; nothing starts yet
    res = await sb.run("print(1 + 1)", timeout=5)
    async with sb.session() as s:               # a notebook-like kernel for one episode
        await s.run("x = 41")
        res = await s.run("print(x + 1)")
    await sb.close()

Interpreters are never shared between sessions (no state leaks across episodes): a warm
one is taken from the pool, and a replacement is launched at once (without waiting for it)
so the next acquisition finds one ready. Every exit path kills what was started: normal
end, exceptions, cancellation of the calling task (shielded cleanup), close(); if our
process dies, bubblewrap's --die-with-parent takes the sandbox down with it.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from agentrl.errors import SandboxError, SandboxUnavailableError
from agentrl.sandbox._wire import Kernel
from agentrl.sandbox.backends import BACKENDS, INSECURE_WARNING, Backend
from agentrl.sandbox.limits import RESTART_STATUSES, SandboxLimits, SandboxResult


class Session:
    """One sandboxed interpreter for one episode. Calls are serialised."""

    def __init__(self, sandbox: Sandbox, kernel: Kernel) -> None:
        self._sandbox = sandbox
        kernel.in_use = True
        self._kernel: Kernel | None = kernel
        self._lock = anyio.Lock()
        self._state_lost = False
        self._closed = False
        self.calls = 0
        self.restarts = 0

    async def run(self, code: str, timeout: float | None = None) -> SandboxResult:
        """Execute `code` in this session's globals; limits end it, never an exception.

        Raises SandboxError only when the sandbox cannot (re)start at all.
        """
        if self._closed:
            raise SandboxError("this sandbox session is closed; open a new one with sb.session()")
        self._sandbox._check_open()
        timeout = self._sandbox.limits.timeout_s if timeout is None else float(timeout)
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds (got {timeout})")
        async with self._lock:
            if self._kernel is None:
                await self._sandbox._pace.wait()
                self._kernel = self._sandbox._spawn()
                self._kernel.in_use = True
            kernel = self._kernel
            try:
                await kernel.wait_ready(self._sandbox.limits.start_timeout_s)
            except SandboxError:
                self._kernel = None
                self._sandbox._forget(kernel)
                raise
            try:
                outcome = await kernel.execute(code, timeout)
            except BaseException:
                # cancelled mid-call: execute() already killed the interpreter
                self._kernel = None
                self._state_lost = True
                with anyio.CancelScope(shield=True):
                    await self._sandbox._discard(kernel)
                raise
            self.calls += 1
            result = SandboxResult(
                stdout=outcome.stdout,
                stderr=outcome.stderr,
                exit_code=outcome.exit_code,
                status=outcome.status,  # type: ignore[arg-type]
                wall_s=outcome.wall_s,
                cpu_s=outcome.cpu_s,
                truncated=outcome.truncated,
                state_lost=self._state_lost,
            )
            self._state_lost = False
            if outcome.kernel_dead or outcome.status in RESTART_STATUSES:
                # Restart now (launched, not awaited) so the next call finds it warm.
                self._kernel = None
                self._state_lost = True
                self.restarts += 1
                await self._sandbox._discard(kernel)
                if not self._sandbox.closed and self._sandbox._pace.take_now():
                    self._kernel = self._sandbox._spawn()
                    self._kernel.in_use = True
                # else: the next call starts one, waiting for the start rate
            return result

    async def aclose(self) -> None:
        self._closed = True
        kernel, self._kernel = self._kernel, None
        if kernel is not None:
            await self._sandbox._discard(kernel)


class StartPace:
    """A token bucket over interpreter starts (``max_starts_per_s``, ``start_burst``): a
    fleet of episodes arriving at once starts its sandboxes at the rate the host (or a
    container runtime's API) sustains instead of all in the same instant."""

    def __init__(self, per_s: float, burst: int) -> None:
        self.per_s = per_s
        self.burst = burst
        self._tokens = float(burst)
        self._at = time.monotonic()
        self.waited_s = 0.0  # total time acquisitions waited for the rate

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.per_s)
        self._at = now

    def take_now(self) -> bool:
        """A start allowed this instant (taken), or False: a warm-pool top-up skips it."""
        if self.per_s <= 0:
            return True
        self._refill()
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False

    async def wait(self) -> None:
        """Wait until a start is allowed, then take it."""
        while not self.take_now():
            pause = (1 - self._tokens) / self.per_s
            self.waited_s += pause
            await anyio.sleep(pause)


class Sandbox:
    """Runs untrusted Python with limits. Create with :func:`create_sandbox`."""

    def __init__(
        self, backend: Backend, limits: SandboxLimits, pace: StartPace | None = None
    ) -> None:
        self.backend = backend
        self.limits = limits
        self._idle: list[Kernel] = []
        self._live: set[Kernel] = set()
        self._slots: anyio.Semaphore | None = None
        # a pace shared by many sandboxes (shared_pace) holds their starts together
        self._pace = pace or StartPace(limits.max_starts_per_s, limits.start_burst)
        self.starts = 0  # interpreters launched (warm ones included)
        self.warm_hits = 0  # sessions that found a warm interpreter ready
        self.closed = False

    @property
    def backend_name(self) -> str:
        return self.backend.name

    @property
    def live_processes(self) -> int:
        """Interpreters started and not yet reaped (warm ones included)."""
        return len(self._live)

    # --- pool ---------------------------------------------------------------------------

    def _spawn(self) -> Kernel:
        kernel = self.backend.make_kernel(self.limits)
        self._live.add(kernel)
        self.starts += 1
        return kernel

    def stats(self) -> dict[str, float]:
        """Counters of this pool: starts, warm hits, time spent waiting for the start rate."""
        return {
            "starts": self.starts,
            "warm_hits": self.warm_hits,
            "live": len(self._live),
            "idle": len(self._idle),
            "start_wait_s": round(self._pace.waited_s, 3),
        }

    def _forget(self, kernel: Kernel) -> None:
        self._live.discard(kernel)

    async def _discard(self, kernel: Kernel) -> None:
        self._live.discard(kernel)
        with anyio.CancelScope(shield=True):
            await kernel.aclose()

    def _top_up(self) -> None:
        ceiling = self.limits.max_sessions + self.limits.pool_size
        while len(self._idle) < self.limits.pool_size and len(self._live) < ceiling:
            if not self._pace.take_now():
                return  # over the start rate: a later acquisition tops up again
            self._idle.append(self._spawn())

    async def _take_kernel(self) -> Kernel:
        for attempt in range(2):
            kernel = None
            while self._idle and kernel is None:
                candidate = self._idle.pop(0)
                if candidate.alive:
                    kernel = candidate
                    self.warm_hits += 1
                else:
                    await self._discard(candidate)
            if kernel is None:
                await self._pace.wait()
                kernel = self._spawn()
            self._top_up()
            try:
                await kernel.wait_ready(self.limits.start_timeout_s)
                return kernel
            except SandboxError:
                self._forget(kernel)
                if attempt == 1:
                    raise
            except BaseException:
                await self._discard(kernel)
                raise
        raise AssertionError("unreachable")

    async def warm_up(self) -> None:
        """Start the warm pool now (otherwise it starts with the first session)."""
        self._check_open()
        self._top_up()
        for kernel in list(self._idle):
            await kernel.wait_ready(self.limits.start_timeout_s)

    # --- public API ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise SandboxError("this sandbox is closed; create a new one with create_sandbox()")

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        """A persistent interpreter for one episode, from the bounded warm pool.

        Raises SandboxError when no slot frees up within `acquire_timeout_s`.
        """
        self._check_open()
        if self._slots is None:
            self._slots = anyio.Semaphore(self.limits.max_sessions)
        slots = self._slots
        try:
            with anyio.fail_after(self.limits.acquire_timeout_s):
                await slots.acquire()
        except TimeoutError:
            raise SandboxError(
                f"no sandbox session became free within acquire_timeout_s="
                f"{self.limits.acquire_timeout_s} (max_sessions={self.limits.max_sessions} are "
                "in use): raise max_sessions or acquire_timeout_s, or run fewer episodes at once"
            ) from None
        try:
            kernel = await self._take_kernel()
            session = Session(self, kernel)
            try:
                yield session
            finally:
                with anyio.CancelScope(shield=True):
                    await session.aclose()
        finally:
            slots.release()

    async def run(self, code: str, timeout: float | None = None) -> SandboxResult:
        """Run `code` once in a fresh interpreter (nothing is kept afterwards)."""
        async with self.session() as s:
            return await s.run(code, timeout=timeout)

    async def close(self) -> None:
        """Kill every interpreter of this sandbox (warm and in use) and wait for them."""
        self.closed = True
        self._idle.clear()
        with anyio.CancelScope(shield=True):
            kernels = list(self._live)
            self._live.clear()
            for kernel in kernels:  # signal all first, then reap
                kernel._signal_kill()
            for kernel in kernels:
                # a session's kernel may be mid-call: its session releases the pipes
                await (kernel.kill() if kernel.in_use else kernel.aclose())
            await self.backend.aclose()

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _pick_auto(limits: SandboxLimits) -> Backend:
    reasons = []
    for name in ("bwrap", "docker"):
        backend = make_backend(name)
        why = backend.problem(limits)
        if why is None:
            return backend
        reasons.append(f"{name}: {why}")
    raise SandboxUnavailableError(
        "no secure sandbox backend works here ("
        + "; ".join(reasons)
        + "). Install bubblewrap, or pass backend='subprocess', allow_insecure=True for "
        "trusted code only"
    )


def make_backend(name: str) -> Backend:
    from agentrl._suggest import suggest

    if name == "docker":
        from agentrl.sandbox.docker_backend import DockerBackend

        return DockerBackend()
    if name not in BACKENDS:
        raise SandboxUnavailableError(
            f"unknown sandbox backend {name!r}{suggest(name, [*BACKENDS, 'docker', 'auto'])}; "
            "choose auto, bwrap, docker or subprocess"
        )
    return BACKENDS[name]()


def create_sandbox(
    backend: str = "auto", *, pace: StartPace | None = None, **limits: Any
) -> Sandbox:
    """A sandbox on `backend` ("auto", "bwrap", "docker", "subprocess") with `limits`.

    Returns at once; interpreters start with the first session. `pace`: a start-rate bucket
    shared with other sandboxes (:func:`shared_pace`), else its own from ``max_starts_per_s``.
    Raises
    SandboxUnavailableError when the backend cannot run here (the message says why) and
    ConfigError for an unknown or invalid limit.
    """
    checked = SandboxLimits.build(**limits)
    if backend == "auto":
        chosen = _pick_auto(checked)
    else:
        chosen = make_backend(backend)
        why = chosen.problem(checked)
        if why is not None:
            raise SandboxUnavailableError(f"sandbox backend {backend!r} cannot run here: {why}")
    if not chosen.secure:
        warnings.warn(INSECURE_WARNING, RuntimeWarning, stacklevel=2)
    return Sandbox(chosen, checked, pace)


async def shared_pace(scope: Any, limits: dict[str, Any]) -> StartPace | None:
    """The one start-rate bucket of a run for ``limits['max_starts_per_s']`` (None: no rate).

    Per-episode sandboxes (a repository workspace binds its own folder, so each episode has
    its own :class:`Sandbox`) take their starts from this bucket, so the rate holds for the
    whole process (a rollout worker: its node's share) and not per episode. `scope`: a
    tool context (``run_resource``), whose run scope keeps the bucket."""
    rate = float(limits.get("max_starts_per_s") or 0.0)
    if rate <= 0:
        return None
    burst = int(limits.get("start_burst", SandboxLimits.model_fields["start_burst"].default))

    async def make(stack: Any) -> StartPace:
        return StartPace(rate, burst)

    return await scope.run_resource(f"sandbox.pace:{rate}:{burst}", make)
