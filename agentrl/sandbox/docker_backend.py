"""The docker backend: the kernel runs by `docker exec` in warm, locked-down containers.

Containers (network off, read-only root, size-capped /tmp tmpfs, memory and pids limits,
no capabilities, no-new-privileges, an unprivileged uid) are reused across sessions: when
a session ends, every process of the sandbox uid in it is killed and /tmp is wiped before
the next session gets it. The kernel speaks its framed protocol over the exec's attached
stdin/stdout ("mux" mode: the code's own stdout/stderr are forwarded as frames).

Container PID 1 reads its attached stdin (`stdin_once`) and exits at end of file, so when
our process dies the engine closes that stream and the container goes with it.

Needs the `docker` extra (`pip install 'agentrl[docker]'`) and a Docker-API engine (Docker,
or `podman system service`); the image is built from agentrl/sandbox/Dockerfile.
"""

from __future__ import annotations

import base64
import contextlib
import os
import struct
import time
from typing import Any

import anyio

import agentrl.sandbox._wire as wire
from agentrl.errors import SandboxError
from agentrl.sandbox.backends import Backend
from agentrl.sandbox.limits import SandboxLimits

# PID 1 of every sandbox container: reap orphans, exit when our attached stdin closes.
_PID1 = """
import os, signal, sys, threading
def reap(*_):
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
signal.signal(signal.SIGCHLD, reap)
def watch():
    while sys.stdin.buffer.read(1 << 16):
        pass
    os._exit(0)
threading.Thread(target=watch, daemon=True).start()
while True:
    signal.pause()
"""

# Between sessions: kill every process of the sandbox uid (not PID 1, not ourselves), wipe /tmp.
_SCRUB = """
import os, shutil
try:
    os.kill(-1, 9)
except ProcessLookupError:
    pass
for name in os.listdir('/tmp'):
    path = os.path.join('/tmp', name)
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)
"""

_PYTHON = "python3"  # resolved by the image's PATH


class DockerBackend(Backend):
    name = "docker"

    def __init__(self) -> None:
        self._client: Any = None
        self._idle: list[Any] = []  # (container, attach socket), scrubbed and ready
        self._all: dict[str, tuple[Any, Any]] = {}

    # --- engine -------------------------------------------------------------------------

    def client(self, limits: SandboxLimits) -> Any:
        if self._client is None:
            import docker  # the `docker` extra; imported only when this backend is used

            if limits.docker_base_url:
                self._client = docker.DockerClient(base_url=limits.docker_base_url, timeout=60)
            else:
                self._client = docker.from_env(timeout=60)
        return self._client

    def problem(self, limits: SandboxLimits) -> str | None:
        if limits.rw_binds:
            return "rw_binds (a host workspace) is bwrap-only; the docker backend has no binds"
        try:
            import docker  # noqa: F401
        except ImportError:
            return "the docker SDK is not installed (pip install 'agentrl[docker]')"
        where = limits.docker_base_url or os.environ.get("DOCKER_HOST", "the default socket")
        try:
            client = self.client(limits)
            client.ping()
        except Exception as e:
            self._client = None
            return f"no Docker-API engine reachable at {where}: {type(e).__name__}: {e}"[:300]
        try:
            client.images.get(limits.docker_image)
        except Exception:
            return (
                f"image {limits.docker_image!r} not found on the engine; build it with "
                f"`docker build -t {limits.docker_image} agentrl/sandbox/`"
            )
        return None

    def make_kernel(self, limits: SandboxLimits) -> DockerKernel:
        return DockerKernel(self, limits)

    # --- containers (blocking; called in worker threads) ----------------------------------

    def take_container(self, limits: SandboxLimits) -> Any:
        while self._idle:
            container = self._idle.pop()
            with contextlib.suppress(Exception):
                container.reload()
                if container.status == "running":
                    return container
            self.drop_container(container)
        return self._create(limits)

    def _create(self, limits: SandboxLimits) -> Any:
        from docker.types import Ulimit

        client = self.client(limits)
        uid = str(limits.sandbox_uid)
        nofile = max(limits.max_open_files, 1024)  # the kernel lowers it after start-up
        api = client.api
        host_config = api.create_host_config(
            auto_remove=True,
            network_mode="bridge" if limits.network else "none",
            mem_limit=f"{limits.memory_mb + 128}m",
            memswap_limit=f"{limits.memory_mb + 128}m",
            pids_limit=limits.max_processes + 4,
            read_only=True,
            tmpfs={"/tmp": f"rw,size={limits.tmp_mb}m,mode=1777"},
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            ulimits=[
                Ulimit(name="nofile", soft=nofile, hard=nofile),
                Ulimit(name="nproc", soft=4096, hard=4096),
                Ulimit(name="core", soft=0, hard=0),
            ],
        )
        # detach=False + stdin_open=True is how the SDK sets StdinOnce: when our attached
        # stdin closes (we died), PID 1 reads end of file and the container ends.
        created = api.create_container(
            limits.docker_image,
            command=[_PYTHON, "-I", "-c", _PID1],
            user=f"{uid}:{uid}",
            detach=False,
            stdin_open=True,
            working_dir="/tmp",
            environment={"HOME": "/tmp", "LANG": "C.UTF-8"},
            labels={"agentrl.sandbox": limits.label or "1", "agentrl.owner": str(os.getpid())},
            host_config=host_config,
        )
        container = client.containers.get(created["Id"])
        attach = container.attach_socket(params={"stdin": 1, "stream": 1})
        container.start()
        self._all[container.id] = (container, attach)
        return container

    def scrub(self, container: Any, limits: SandboxLimits) -> bool:
        """Kill the sandbox uid's processes and wipe /tmp; False if that failed."""
        uid = str(limits.sandbox_uid)
        for attempt in range(3):  # a process flood can leave no pid free for a moment
            try:
                res = container.exec_run([_PYTHON, "-I", "-c", _SCRUB], user=f"{uid}:{uid}")
                if res.exit_code == 0:
                    return True
            except Exception:
                pass
            time.sleep(0.2 * (attempt + 1))
        return False

    def give_back(self, container: Any) -> None:
        self._idle.append(container)

    def drop_container(self, container: Any) -> None:
        _, attach = self._all.pop(container.id, (None, None))
        with contextlib.suppress(Exception):
            container.kill()
        with contextlib.suppress(Exception):
            container.remove(force=True)
        if attach is not None:
            with contextlib.suppress(Exception):
                attach.close()

    def close_all(self) -> None:
        self._idle.clear()
        for container, _ in list(self._all.values()):
            self.drop_container(container)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self.close_all)


class DockerKernel:
    """The kernel exec'd in a warm container; same surface as KernelProcess."""

    def __init__(self, backend: DockerBackend, limits: SandboxLimits) -> None:
        self.backend = backend
        self.limits = limits
        self.in_use = False
        self._container: Any = None
        self._exec_id: str | None = None
        self._sock: Any = None
        self._raw: Any = None
        self._mux = bytearray()  # docker's 8-byte-header stream, not yet demultiplexed
        self._proto = bytearray()
        self._diag = bytearray()  # the kernel's own stderr (crashes)
        self._eof = False
        self._dead = False
        self._ready = False
        self._calls = 0
        self._leftover = {"out": b"", "err": b""}

    @property
    def alive(self) -> bool:
        return not self._dead

    # --- start / stop -------------------------------------------------------------------

    def _start_blocking(self) -> None:
        cfg = wire.kernel_config(self.limits)
        cfg.update(mux=True, nproc=None)  # the container's pids limit bounds processes
        self._container = self.backend.take_container(self.limits)
        api = self.backend.client(self.limits).api
        uid = str(self.limits.sandbox_uid)
        ex = api.exec_create(
            self._container.id,
            [
                _PYTHON,
                "-I",
                "-c",
                wire.kernel_source(),
                "0",
                "1",
                wire.encode_config(cfg),
                wire.kernel_tag(self.limits),
            ],
            stdin=True,
            stdout=True,
            stderr=True,
            user=f"{uid}:{uid}",
            workdir="/tmp",
        )
        self._exec_id = ex["Id"]
        self._sock = api.exec_start(self._exec_id, socket=True)
        self._raw = getattr(self._sock, "_sock", self._sock)
        self._raw.setblocking(False)

    async def wait_ready(self, timeout: float) -> None:
        if self._ready:
            return
        if self._dead:
            raise SandboxError("the docker sandbox was closed")
        frame: dict[str, Any] | None = None
        try:
            with anyio.move_on_after(timeout):
                if self._raw is None:
                    await anyio.to_thread.run_sync(self._start_blocking)
                frame = await self._read_frame(skip_output=True)
        except SandboxError:
            raise
        except Exception as e:
            await self.kill()
            raise SandboxError(
                f"the docker sandbox failed to start: {type(e).__name__}: {e}"
            ) from e
        if frame is None or frame.get("op") != "ready":
            detail = self._diag.decode("utf-8", "replace").strip()[-800:] or "no reply"
            await self.kill()
            raise SandboxError(f"the docker sandbox did not start: {detail}")
        self._ready = True

    def _signal_kill(self) -> None:
        """Nothing to signal synchronously: aclose() scrubs or drops the container."""

    async def kill(self) -> None:
        with anyio.CancelScope(shield=True):
            if self._dead:
                return
            self._dead = True
            if self._raw is not None:
                with contextlib.suppress(Exception):
                    self._raw.close()
            container, self._container = self._container, None
            if container is None:
                return

            def stop() -> None:
                if self.backend.scrub(container, self.limits):
                    self.backend.give_back(container)
                else:
                    self.backend.drop_container(container)

            await anyio.to_thread.run_sync(stop)

    async def aclose(self) -> None:
        await self.kill()

    # --- framing over the attached exec socket --------------------------------------------

    async def _recv(self) -> bytes:
        while True:
            try:
                return self._raw.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                await anyio.wait_readable(self._raw)
            except OSError:
                return b""

    async def _read_frame(self, skip_output: bool = False) -> dict[str, Any] | None:
        while True:
            frame = wire.take_frame(self._proto)
            if frame is not None:
                if skip_output and frame.get("op") == "out":
                    continue
                return frame
            if self._eof:
                return None
            data = await self._recv()
            if not data:
                self._eof = True
                continue
            self._mux += data
            while len(self._mux) >= 8:  # docker stream header: type, 0, 0, 0, size
                kind, size = self._mux[0], struct.unpack(">I", self._mux[4:8])[0]
                if len(self._mux) < 8 + size:
                    break
                payload = bytes(self._mux[8 : 8 + size])
                del self._mux[: 8 + size]
                (self._proto if kind == 1 else self._diag).extend(payload)

    async def _send(self, obj: dict[str, Any]) -> bool:
        return await wire.write_frame(obj, self._raw.send, self._raw)

    # --- one call -----------------------------------------------------------------------

    async def execute(self, code: str, timeout: float) -> wire.CallOutcome:
        limits = self.limits
        self._calls += 1
        nonce, out, err = wire.call_captures(limits, self._leftover)
        reply: dict[str, Any] | None = None
        flooded = broken = False
        timed_out = True
        t0 = time.perf_counter()
        try:
            with anyio.move_on_after(timeout):
                frame_out = {"op": "exec", "id": self._calls, "code": code}
                frame_out.update(cpu_s=limits.cpu_s, nonce=nonce.decode("latin-1"))
                if await self._send(frame_out):
                    while not (reply is not None and out.found and err.found):
                        frame = await self._read_frame()
                        if frame is None:
                            break
                        op = frame.get("op")
                        if op == "out":
                            cap = out if frame.get("s") == 1 else err
                            data = base64.b64decode(frame.get("d", ""))
                            if cap.found:
                                cap.leftover += data
                            else:
                                cap.feed(data)
                            if out.total + err.total > limits.output_kill_bytes:
                                flooded = True
                                break
                        elif op == "done":
                            reply = frame
                        else:
                            broken = True
                            break
                timed_out = False
        except BaseException:
            await self.kill()
            raise
        wall = time.perf_counter() - t0
        done = reply is not None and out.found and err.found
        if done and not (flooded or timed_out or broken):
            assert reply is not None
            self._leftover = {"out": out.leftover, "err": err.leftover}
            return wire.CallOutcome(
                out.text(),
                err.text(),
                int(reply.get("exit_code", 1)),
                str(reply.get("status", "error")),
                wall,
                float(reply.get("cpu_s", 0.0)),
                out.truncated or err.truncated,
                kernel_dead=False,
            )
        rc: int | None = None
        if not (flooded or timed_out or broken) and self._exec_id is not None:
            api = self.backend.client(limits).api
            with contextlib.suppress(Exception):
                rc = (await anyio.to_thread.run_sync(api.exec_inspect, self._exec_id)).get(
                    "ExitCode"
                )
        await self.kill()
        out.finish()
        err.finish()
        if flooded:
            status, exit_code = "output_limit", -9
        elif timed_out:
            status, exit_code = "timeout", -9
        elif broken:
            status, exit_code = "sandbox_error", -1
        else:
            from agentrl.sandbox.backends import BwrapBackend

            status, exit_code = BwrapBackend().classify_exit(rc)  # 128 + N = signal N
        return wire.CallOutcome(
            out.text(),
            err.text(),
            exit_code,
            status,
            wall,
            0.0,  # the kernel never reported: CPU time of a killed docker call is unknown
            out.truncated or err.truncated,
            kernel_dead=True,
        )
