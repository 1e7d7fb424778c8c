"""One sandboxed interpreter, seen from the host: spawn, framed calls, output capture, kill.

The kernel (``_kernel.py``) talks over two private pipes; its fd 1 and fd 2 are two more
pipes the host drains itself, so output written by any process in the sandbox is captured,
counted and cut at the limit even while the code spins. A per-call nonce written by the
kernel after the code finishes marks where the call's output ends in each stream.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from typing import TYPE_CHECKING, Any

import anyio

from agentrl.errors import SandboxError
from agentrl.sandbox._wire import (
    CallOutcome,
    _Capture,
    _read_now,
    _read_some,
    call_captures,
    encode_config,
    kernel_config,
    kernel_source,
    kernel_tag,
    take_frame,
    write_frame,
)
from agentrl.sandbox.limits import SandboxLimits

if TYPE_CHECKING:
    from agentrl.sandbox.backends import Backend
    from agentrl.sandbox.cgroups import SandboxCgroup


class KernelProcess:
    """A sandboxed interpreter process and the host ends of its four pipes."""

    def __init__(self, backend: Backend, limits: SandboxLimits) -> None:
        self.backend = backend
        self.limits = limits
        self._popen: subprocess.Popen[bytes] | None = None
        self._fds: dict[str, int] = {}
        self._proto = bytearray()
        self._leftover = {"out": b"", "err": b""}
        self._ready = False
        self._cpu_reported = 0.0  # cumulative CPU the kernel has accounted for
        self._calls = 0
        self.returncode: int | None = None
        self.rusage_cpu: float | None = None
        self._cleanup_paths: list[str] = []
        self.in_use = False  # owned by a session (which releases the pipes)
        self.cgroup: SandboxCgroup | None = None
        self._info = bytearray()  # bwrap's --info-fd JSON, as it arrives
        self._ns_init: int | None = None
        self._spawn()

    # --- life cycle ---------------------------------------------------------------------

    def _spawn(self) -> None:
        in_r, in_w = os.pipe()  # host -> kernel frames
        out_r, out_w = os.pipe()  # kernel -> host frames
        so_r, so_w = os.pipe()  # the code's stdout
        se_r, se_w = os.pipe()  # the code's stderr
        info_r, info_w = os.pipe() if self.backend.uses_info_fd else (-1, -1)
        child_ends = [in_r, out_w, so_w, se_w] + ([info_w] if info_w >= 0 else [])
        python_args = [
            self.limits.python,
            "-I",
            "-c",
            kernel_source(),
            str(in_r),
            str(out_w),
            encode_config(kernel_config(self.limits)),
            kernel_tag(self.limits),
        ]
        try:
            launch = self.backend.launch(python_args, info_w, self.limits)
            self._cleanup_paths = launch.cleanup_paths
            self.cgroup = launch.cgroup
            self._popen = subprocess.Popen(
                launch.argv,
                stdin=subprocess.DEVNULL,
                stdout=so_w,
                stderr=se_w,
                pass_fds=tuple(fd for fd in (in_r, out_w, info_w) if fd >= 0),
                close_fds=True,
                env=launch.env,
                cwd=launch.cwd,
                start_new_session=True,  # terminal signals go to us; we clean up
            )
        except BaseException as e:
            for fd in [*child_ends, in_w, out_r, so_r, se_r, info_r]:
                if fd >= 0:
                    os.close(fd)
            self._remove_paths()
            if isinstance(e, OSError):
                raise SandboxError(f"could not start the {self.backend.name} sandbox: {e}") from e
            raise
        for fd in child_ends:
            os.close(fd)
        self._fds = {"in": in_w, "proto": out_r, "out": so_r, "err": se_r}
        if info_r >= 0:
            self._fds["info"] = info_r
        for fd in self._fds.values():
            os.set_blocking(fd, False)
        if hasattr(os, "pidfd_open"):  # Linux >= 5.3: wait for exit without polling
            with contextlib.suppress(OSError):
                self._fds["pidfd"] = os.pidfd_open(self._popen.pid)

    @property
    def pid(self) -> int:
        assert self._popen is not None
        return self._popen.pid

    @property
    def alive(self) -> bool:
        if self.returncode is not None:
            return False
        self._poll()
        return self.returncode is None

    def _poll(self) -> None:
        if self.returncode is not None or self._popen is None:
            return
        try:
            pid, status, rusage = os.wait4(self._popen.pid, os.WNOHANG)
        except ChildProcessError:  # someone else reaped it
            self.returncode = self._popen.returncode if self._popen.returncode is not None else -9
            self._popen.returncode = self.returncode
            return
        if pid == 0:
            return
        self.returncode = os.waitstatus_to_exitcode(status)
        self._popen.returncode = self.returncode
        self.rusage_cpu = rusage.ru_utime + rusage.ru_stime

    async def _wait_exit(self) -> None:
        while self.returncode is None:
            self._poll()
            if self.returncode is None:
                if "pidfd" in self._fds:
                    await anyio.wait_readable(self._fds["pidfd"])
                else:
                    await anyio.sleep(0.005)

    async def wait_ready(self, timeout: float) -> None:
        """Wait for the kernel's hello; SandboxError (with the sandbox's stderr) if none."""
        if self._ready:
            return
        frame: dict[str, Any] | None = None
        with anyio.move_on_after(timeout):
            frame = await self._read_frame()
        if frame is None or frame.get("op") != "ready":
            await self.kill()
            err = _read_now(self._fds.get("err", -1), 4096) if "err" in self._fds else b""
            detail = err.decode("utf-8", "replace").strip() or f"exit status {self.returncode}"
            self._close_fds()
            why = "did not start in time" if frame is None and self.returncode is None else "failed"
            raise SandboxError(
                f"the {self.backend.name} sandbox {why}: {detail[-800:]} "
                f"(check `agentrl sandbox check`; start_timeout_s={self.limits.start_timeout_s})"
            )
        self._ready = True
        self._cpu_reported = float(frame.get("cpu", 0.0))

    def _signal_kill(self, force: bool = False) -> None:
        if self._popen is None or not self.alive:
            return
        if not force and self.backend.uses_info_fd and self.ns_init_pid() is None:
            return  # still starting: kill() waits until it can take down the whole tree
        target_pidfd = self.backend.inner_pidfd(self)
        try:
            if target_pidfd is not None:
                # Killing the pid namespace's init takes every process in it down with it;
                # bwrap outside then exits on its own, so everything is reaped when it has.
                with contextlib.closing(_FD(target_pidfd)):
                    signal.pidfd_send_signal(target_pidfd, signal.SIGKILL)
            elif self.backend.kill_process_group:
                os.killpg(self._popen.pid, signal.SIGKILL)
            else:
                os.kill(self._popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    async def kill(self) -> None:
        """Kill every process of this sandbox and reap it. Safe to call twice; shielded."""
        with anyio.CancelScope(shield=True):
            if self._popen is not None and self.returncode is None:
                # Still starting (bwrap has not said which pid is the namespace's init)?
                # Give it a moment: killing only the outer bwrap before its child has armed
                # its parent-death signal could orphan the child.
                with anyio.move_on_after(1.0):
                    while self.backend.uses_info_fd and self.ns_init_pid() is None and self.alive:
                        await anyio.sleep(0.005)
                self._signal_kill(force=True)
                with anyio.move_on_after(2.0):
                    await self._wait_exit()
                if self.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        if self.backend.kill_process_group:
                            os.killpg(self._popen.pid, signal.SIGKILL)
                        os.kill(self._popen.pid, signal.SIGKILL)
                    await self._wait_exit()
            if self.cgroup is not None:
                # belt and braces: nothing that ever joined the sandbox's cgroup survives
                self.cgroup.kill_all()
            self._remove_paths()

    async def aclose(self) -> None:
        """Kill, reap and release the pipes."""
        await self.kill()
        self._close_fds()

    def _close_fds(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = {}

    def _remove_paths(self) -> None:
        import shutil

        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
        for path in self._cleanup_paths:
            shutil.rmtree(path, ignore_errors=True)
        self._cleanup_paths = []

    def ns_init_pid(self) -> int | None:
        """The host pid of bwrap's child (init of the sandbox's pid namespace), once known."""
        if self._ns_init is None:
            fd = self._fds.get("info", -1)
            if fd >= 0:
                self._info += _read_now(fd, 1 << 14)
                self._ns_init = parse_child_pid(bytes(self._info))
        return self._ns_init

    # --- framing ------------------------------------------------------------------------

    async def _read_frame(self) -> dict[str, Any] | None:
        """The next frame from the kernel, or None when the kernel is gone."""
        fd = self._fds["proto"]
        while True:
            frame = take_frame(self._proto)
            if frame is not None:
                return frame
            data = await _read_some(fd)
            if not data:
                return None
            self._proto += data

    async def _write_frame(self, obj: dict[str, Any]) -> bool:
        fd = self._fds["in"]
        return await write_frame(obj, lambda view: os.write(fd, view), fd)

    # --- one call -----------------------------------------------------------------------

    async def execute(self, code: str, timeout: float) -> CallOutcome:
        """Run one snippet. Kills the sandbox on timeout / output flood / cancellation."""
        limits = self.limits
        self._calls += 1
        nonce, out, err = call_captures(limits, self._leftover)
        reply: dict[str, Any] | None = None
        flooded = False
        timed_out = True
        oom_before = self.cgroup.oom_kills() if self.cgroup is not None else 0
        t0 = time.perf_counter()
        try:
            with anyio.move_on_after(timeout):
                async with anyio.create_task_group() as tg:

                    async def pump(fd: int, cap: _Capture) -> None:
                        nonlocal flooded
                        while not cap.found:
                            data = await _read_some(fd)
                            if not data:
                                return
                            cap.feed(data)
                            if out.total + err.total > limits.output_kill_bytes:
                                flooded = True
                                tg.cancel_scope.cancel()
                                return

                    if not out.found:
                        tg.start_soon(pump, self._fds["out"], out)
                    if not err.found:
                        tg.start_soon(pump, self._fds["err"], err)
                    sent = await self._write_frame(
                        {
                            "op": "exec",
                            "id": self._calls,
                            "code": code,
                            "cpu_s": limits.cpu_s,
                            "nonce": nonce.decode("latin-1"),
                        }
                    )
                    reply = await self._read_frame() if sent else None
                    if reply is None or reply.get("op") != "done":
                        tg.cancel_scope.cancel()  # the kernel is gone or mad: stop waiting
                timed_out = False
        except BaseException:
            # Cancelled by the caller (or worse): the code may still run; take it all down.
            await self.kill()
            raise
        wall = time.perf_counter() - t0

        if reply is not None and reply.get("op") == "done" and not flooded and not timed_out:
            self._leftover = {"out": out.leftover, "err": err.leftover}
            cpu = float(reply.get("cpu_s", 0.0))
            self._cpu_reported += cpu
            status = str(reply.get("status", "error"))
            oom = self.cgroup is not None and self.cgroup.oom_kills() > oom_before
            if oom and status in ("ok", "error"):
                # a process of the snippet was OOM-killed by the sandbox's memory cgroup
                status = "memory"
                err.kept += b"\n[a process was killed: the sandbox memory limit was reached]\n"
            return CallOutcome(
                out.text(),
                err.text(),
                int(reply.get("exit_code", 1)),
                status,
                wall,
                cpu,
                out.truncated or err.truncated,
                kernel_dead=False,
            )

        # Something went wrong: collect a natural exit status if the kernel died on its own,
        # then make sure nothing of it survives, and read what output is left.
        if not flooded and not timed_out:
            with anyio.move_on_after(0.5):
                await self._wait_exit()
        natural_rc = self.returncode
        tree_cpu = _tree_cpu(self.backend.tree_root(self)) if natural_rc is None else None
        oom = self.cgroup is not None and self.cgroup.oom_kills() > oom_before
        await self.kill()
        for cap, key in ((out, "out"), (err, "err")):
            if not cap.found and key in self._fds:
                cap.feed(_read_now(self._fds[key], limits.output_kill_bytes))
            cap.finish()
        used = tree_cpu if tree_cpu is not None else (self.rusage_cpu or 0.0)
        cpu = max(0.0, used - self._cpu_reported)
        if flooded:
            status, exit_code = "output_limit", -int(signal.SIGKILL)
        elif timed_out:
            status, exit_code = "timeout", -int(signal.SIGKILL)
        elif reply is not None:  # a frame that is not "done": the protocol broke
            status, exit_code = "sandbox_error", -1
        else:
            status, exit_code = self.backend.classify_exit(natural_rc)
            if status == "killed" and oom:
                status = "memory"  # the sandbox's memory cgroup killed it
        return CallOutcome(
            out.text(),
            err.text(),
            exit_code,
            status,
            wall,
            cpu,
            out.truncated or err.truncated,
            kernel_dead=True,
        )


def _tree_cpu(root: int | None) -> float | None:
    """CPU seconds of `root` and its live descendants (with reaped children), from /proc."""
    if root is None:
        return None
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid, ppid = int(entry.name), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        # utime, stime, cutime, cstime are fields 14-17 of stat (11-14 after the name)
        times[pid] = sum(int(x) for x in fields[11:15]) / tick
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += times.get(pid, 0.0)
        stack.extend(children.get(pid, ()))
    return total


class _FD:
    """Close an fd via contextlib.closing."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def parse_child_pid(info: bytes) -> int | None:
    m = re.search(rb'"child-pid"\s*:\s*(\d+)', info)
    return int(m.group(1)) if m else None
