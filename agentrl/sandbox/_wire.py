"""What the host and a sandboxed kernel agree on, whatever runs the kernel (a local
process or a container): the kernel's source and its config argument, reading the pipes,
one call's output capture (cut at the limit, ended by a per-call nonce) and the outcome.
"""

from __future__ import annotations

import json
import marshal
import os
import secrets
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio

from agentrl.sandbox.limits import SandboxLimits

_KERNEL_SOURCE: str | None = None
_READ_CHUNK = 1 << 16


def kernel_source() -> str:
    global _KERNEL_SOURCE
    if _KERNEL_SOURCE is None:
        _KERNEL_SOURCE = Path(__file__).with_name("_kernel.py").read_text()
    return _KERNEL_SOURCE


def kernel_config(limits: SandboxLimits) -> dict[str, Any]:
    mb = 1024 * 1024
    return {
        "as": limits.memory_mb * mb,
        "nproc": limits.max_processes,
        "fsize": limits.max_file_mb * mb,
        "nofile": limits.max_open_files,
        "cpu_hard": limits.session_cpu_s,
    }


def kernel_tag(limits: SandboxLimits) -> str:
    """A plain-text argument naming the kernel in ps and /proc/*/cmdline (it is ignored)."""
    return f"agentrl-sandbox:{limits.label}" if limits.label else "agentrl-sandbox"


def encode_config(cfg: dict[str, Any]) -> str:
    """The kernel's argv form of its config (it reads marshal, which needs no import)."""
    return marshal.dumps(cfg, 4).hex()


async def _read_some(fd: int) -> bytes:
    """Read what is there (b"" at end of file), waiting without blocking the loop."""
    while True:
        try:
            return os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            await anyio.wait_readable(fd)


def take_frame(buffer: bytearray) -> dict[str, Any] | None:
    """Cut the first whole length-prefixed JSON frame off `buffer` (None until one has
    fully arrived); a frame that is not JSON comes back as ``{"op": "garbage"}``."""
    if len(buffer) < 4:
        return None
    size = int.from_bytes(buffer[:4], "big")
    if len(buffer) < 4 + size:
        return None
    body = bytes(buffer[4 : 4 + size])
    del buffer[: 4 + size]
    try:
        return json.loads(body)
    except ValueError:
        return {"op": "garbage"}


async def write_frame(
    obj: dict[str, Any], send: Callable[[memoryview], int], waitable: Any
) -> bool:
    """Send one length-prefixed marshal frame to the kernel through `send` (a non-blocking
    write returning the bytes taken), waiting on `waitable` when the pipe is full; False
    once the other side is gone."""
    body = marshal.dumps(obj, 4)
    view = memoryview(struct.pack(">I", len(body)) + body)
    while view:
        try:
            view = view[send(view) :]
        except (BlockingIOError, InterruptedError):
            await anyio.wait_writable(waitable)
        except OSError:  # BrokenPipeError included: the kernel is gone
            return False
    return True


def _read_now(fd: int, limit: int) -> bytes:
    """Read what is buffered right now, up to `limit` bytes, without waiting."""
    chunks: list[bytes] = []
    got = 0
    while got < limit:
        try:
            chunk = os.read(fd, _READ_CHUNK)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


class _Capture:
    """One output stream of one call: keeps the first `keep` bytes, finds the end nonce."""

    def __init__(self, sentinel: bytes, keep: int, initial: bytes) -> None:
        self.sentinel = sentinel
        self.keep = keep
        self.kept = bytearray()
        self.total = 0
        self.tail = b""
        self.found = False
        self.leftover = b""  # bytes after the nonce: they belong to the next call
        if initial:
            self.feed(initial)

    def feed(self, data: bytes) -> None:
        buf = self.tail + data
        i = buf.find(self.sentinel)
        if i >= 0:
            self._emit(buf[:i])
            self.leftover = buf[i + len(self.sentinel) :]
            self.tail = b""
            self.found = True
            return
        cut = max(0, len(buf) - (len(self.sentinel) - 1))
        self._emit(buf[:cut])
        self.tail = buf[cut:]

    def finish(self) -> None:
        self._emit(self.tail)
        self.tail = b""

    def _emit(self, data: bytes) -> None:
        self.total += len(data)
        room = self.keep - len(self.kept)
        if room > 0:
            self.kept += data[:room]

    @property
    def truncated(self) -> bool:
        return self.total > self.keep

    def text(self) -> str:
        text = bytes(self.kept).decode("utf-8", errors="replace")
        if self.truncated:
            text += f"\n[... output truncated: {self.total - self.keep} more bytes not shown ...]\n"
        return text


def call_captures(
    limits: SandboxLimits, leftover: dict[str, bytes]
) -> tuple[bytes, _Capture, _Capture]:
    """A new call's end nonce and its stdout and stderr captures, fed what the previous
    call left after its nonce."""
    nonce = b"\x00<agentrl-end-" + secrets.token_hex(12).encode() + b">\x00"
    keep = limits.max_output_bytes
    return nonce, _Capture(nonce, keep, leftover["out"]), _Capture(nonce, keep, leftover["err"])


@dataclass
class CallOutcome:
    """A call as the kernel process saw it; the session turns it into a SandboxResult."""

    stdout: str
    stderr: str
    exit_code: int
    status: str
    wall_s: float
    cpu_s: float
    truncated: bool
    kernel_dead: bool  # the interpreter is gone (killed or exited): state is lost


class Kernel(Protocol):
    """What the pool needs of an interpreter (KernelProcess, or DockerKernel)."""

    in_use: bool

    @property
    def alive(self) -> bool: ...

    async def wait_ready(self, timeout: float) -> None: ...

    async def execute(self, code: str, timeout: float) -> CallOutcome: ...

    def _signal_kill(self) -> None: ...

    async def kill(self) -> None: ...

    async def aclose(self) -> None: ...
