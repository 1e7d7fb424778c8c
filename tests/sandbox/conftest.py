"""Shared helpers for the sandbox tests: the anyio backend and a process-leak detector."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from agentrl.sandbox.backends import BwrapBackend
from agentrl.sandbox.limits import SandboxLimits
from tests.procs import live_descendants
from tests.waiting import wait_until

BWRAP_PROBLEM = BwrapBackend().problem(SandboxLimits())
needs_bwrap = pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=f"bwrap: {BWRAP_PROBLEM}")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def processes_with(marker: str) -> list[int]:
    """Pids of processes (anywhere on the host) whose command line contains `marker`."""
    found = []
    needle = marker.encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                if needle in f.read():
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def descendants(root: int) -> list[int]:
    """Live (non-zombie) descendants of `root`, sorted."""
    return sorted(live_descendants(root))


def wait_gone(marker: str, timeout: float = 60.0) -> list[int]:
    """Poll until no process carries `marker` (the kernel tears namespaces down async).
    The timeout only ends a hang (a loaded machine may take seconds): the claim is "gone"."""

    def left() -> list[int]:
        return [p for p in processes_with(marker) if not _is_zombie(p)]

    try:
        wait_until(lambda: not left(), f"no process carrying {marker}", timeout=timeout)
    except AssertionError:
        pass  # the caller asserts on what is left, naming it
    return left()


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


@pytest.fixture
def marker() -> Iterator[str]:
    """A unique label for this test's sandboxes and the processes its snippets spawn."""
    tag = f"sbxtest-{uuid.uuid4().hex[:12]}"
    yield tag
    assert wait_gone(tag) == [], f"processes left behind carrying {tag}"
