"""Per-sandbox memory cgroups (v1) where this process may create them.

rlimits bound each process; a memory cgroup bounds the sandbox as a whole, its RAM-backed
/tmp included. Used by the bwrap backend when the controller's directory is writable
(typically as root); otherwise skipped and reported by `agentrl sandbox check`. Processes
need no cgroup: RLIMIT_NPROC already counts per sandbox (each has its own user namespace),
and every cgroup a new process joins costs an RCU grace period (~5 ms) on cgroup v1.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from pathlib import Path

_PREFIX = "agentrl-"
_counter = itertools.count()
_roots: dict[str, Path] | None = None


def _own_dirs() -> dict[str, Path]:
    """{controller: the directory of our own cgroup} for a writable v1 memory controller."""
    mounts: dict[str, Path] = {}
    with contextlib.suppress(OSError), open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 4 and parts[2] == "cgroup" and "memory" in parts[3].split(","):
                mounts["memory"] = Path(parts[1])
    found: dict[str, Path] = {}
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as f:
        for line in f:
            _, ctls, path = line.rstrip("\n").split(":", 2)
            for ctl in ctls.split(","):
                if ctl in mounts:
                    here = mounts[ctl] / path.lstrip("/")
                    if here.is_dir() and os.access(here, os.W_OK):
                        found[ctl] = here
    return found


def roots() -> dict[str, Path]:
    """Cached: the memory controller or nothing, after sweeping cgroups of dead owners."""
    global _roots
    if _roots is None:
        _roots = _own_dirs()
        for root in _roots.values():
            _sweep(root)
    return _roots


def problem() -> str | None:
    if roots():
        return None
    return "no writable cgroup v1 memory hierarchy (memory is bounded per process only)"


def _sweep(root: Path) -> None:
    """Remove empty sandbox cgroups whose owning process is gone (we were killed)."""
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            if entry.name.startswith(_PREFIX) and entry.is_dir():
                owner = entry.name[len(_PREFIX) :].split("-", 1)[0]
                if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                    with contextlib.suppress(OSError):
                        entry.rmdir()


class SandboxCgroup:
    """One sandbox's memory cgroup."""

    def __init__(self, memory_bytes: int) -> None:
        name = f"{_PREFIX}{os.getpid()}-{next(_counter)}"
        self.dirs: dict[str, Path] = {}
        self._oom_fd: int | None = None
        try:
            for ctl, root in roots().items():
                path = root / name
                path.mkdir()
                self.dirs[ctl] = path
            mem = self.dirs["memory"]
            (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
            swap = mem / "memory.memsw.limit_in_bytes"
            if swap.exists():
                with contextlib.suppress(OSError):
                    swap.write_text(str(memory_bytes))
        except OSError:
            self.remove()
            raise

    def procs_files(self) -> list[str]:
        return [str(path / "cgroup.procs") for path in self.dirs.values()]

    def oom_kills(self) -> int:
        """How many processes the memory cgroup's OOM killer has killed so far."""
        mem = self.dirs.get("memory")
        if mem is None:
            return 0
        try:
            if self._oom_fd is None:  # kept open: read twice per call, cheaply
                self._oom_fd = os.open(mem / "memory.oom_control", os.O_RDONLY | os.O_CLOEXEC)
            text = os.pread(self._oom_fd, 4096, 0)
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(b" ")
            if key == b"oom_kill":
                with contextlib.suppress(ValueError):
                    return int(value)
        return 0

    def kill_all(self, timeout: float = 2.0) -> None:
        """SIGKILL every process still in the cgroup until it is empty (or `timeout`)."""
        mem = self.dirs.get("memory")
        if mem is None:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                pids = [int(p) for p in (mem / "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                return
            if not pids:
                return
            for pid in pids:
                self._kill_member(pid, mem.name)
            time.sleep(0.002)

    @staticmethod
    def _kill_member(pid: int, name: str) -> None:
        """SIGKILL `pid` only if it is still in our cgroup (a pidfd pins its identity)."""
        try:
            pidfd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            return
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                if f"/{name}\n" in f.read():
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(pidfd)

    def remove(self) -> None:
        if self._oom_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._oom_fd)
            self._oom_fd = None
        for path in self.dirs.values():
            for _ in range(50):  # the last processes may still be on their way out
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.002)
        self.dirs = {}
