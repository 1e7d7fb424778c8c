"""The docker backend against a real Docker-API engine (skipped when none is reachable).

Point it at an engine with DOCKER_HOST (e.g. podman's service, see docs/sandbox.md) and
build the image from agentrl/sandbox/Dockerfile first.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import anyio
import pytest

from agentrl.sandbox import create_sandbox
from agentrl.sandbox.docker_backend import DockerBackend
from agentrl.sandbox.limits import SandboxLimits
from tests.waiting import wait_until

_PROBLEM = DockerBackend().problem(SandboxLimits())
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(_PROBLEM is not None, reason=f"docker: {_PROBLEM}"),
]


def _containers(label: str) -> list[str]:
    import docker

    client = docker.from_env()
    return [
        c.id
        for c in client.containers.list(all=True, filters={"label": f"agentrl.sandbox={label}"})
    ]


async def test_docker_sessions_limits_and_reuse(marker: str) -> None:
    sb = create_sandbox("docker", label=marker, pool_size=0, memory_mb=256, max_processes=16)
    try:
        async with sb.session() as s:
            assert (await s.run("x = 41\nopen('/tmp/left', 'w').write('secret')")).ok
            r = await s.run("import os\nprint(x + 1, os.getuid())")
            assert (r.status, r.stdout) == ("ok", "42 65534\n")
            t0 = time.perf_counter()  # allow-clock: the sandbox's wall limit is a time limit
            r = await s.run("while True: pass", timeout=1)
            # allow-clock: the same limit; the slack is room for a loaded machine to kill
            assert r.status == "timeout" and time.perf_counter() - t0 < 1 + 10
            r = await s.run("print('x' in globals())")
            assert r.state_lost and r.stdout == "False\n"
            r = await s.run("import sys\nsys.stdout.write('y' * (64 << 20))", timeout=10)
            assert r.status == "output_limit" and r.truncated
            r = await s.run("b = bytearray(4 * 1024**3)")
            assert r.status == "memory"
            r = await s.run("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)")
            assert r.status == "error" and "unreachable" in r.stderr
            r = await s.run("open('/usr/evil', 'w')")
            assert r.status == "error" and "Read-only file system" in r.stderr
            r = await s.run("import os\nwhile True:\n    os.fork()", timeout=5)
            assert r.status == "error"  # the pids limit starves the bomb
            r = await s.run(
                "import sys, os\nsys.stdout.buffer.write(b'a\\x00\\xff')\nprint(input())"
            )
            assert r.status == "error" and r.stdout == "a\x00\ufffd" and "EOFError" in r.stderr
        used = _containers(marker)
        assert len(used) == 1  # kept warm for the next session
        async with sb.session() as s:  # the same container, scrubbed
            r = await s.run("import os\nprint(os.listdir('/tmp'), len(os.listdir('/proc')))")
            assert r.stdout.startswith("[]")
        assert _containers(marker) == used
    finally:
        await sb.close()
    assert _containers(marker) == [] or _wait_no_containers(marker)


def _wait_no_containers(label: str) -> bool:
    """Docker removes a container asynchronously: poll until it is gone (the timeout only
    ends a hang; the claim is "gone")."""
    wait_until(
        lambda: not _containers(label), f"the containers labelled {label} gone", interval=0.2
    )
    return True


def test_docker_container_dies_with_its_parent(marker: str) -> None:
    script = textwrap.dedent(
        f"""
        import anyio
        from agentrl.sandbox import create_sandbox
        async def main():
            sb = create_sandbox("docker", label={marker!r}, pool_size=0)
            async with sb.session() as s:
                assert (await s.run("x = 1")).ok
                print("READY", flush=True)
                # allow-sleep: the host's work is to hold the container until it is SIGKILLed
                await anyio.sleep(100)
        anyio.run(main)
        """
    )
    host = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None
        assert host.stdout.readline().strip() == "READY"
        assert len(_containers(marker)) == 1
        os.kill(host.pid, signal.SIGKILL)
        host.wait(60)  # SIGKILL ends it; the bound only ends a hang
        assert _wait_no_containers(marker), "container outlived its parent"
    finally:
        host.kill()
        host.wait()


async def test_docker_concurrent_sessions(marker: str) -> None:
    async with create_sandbox("docker", label=marker, pool_size=0, max_sessions=4) as sb:
        out: dict[int, str] = {}

        async def episode(i: int) -> None:
            async with sb.session() as s:
                await s.run(f"v = {i}")
                out[i] = (await s.run("print(v)")).stdout

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(episode, i)
    assert out == {i: f"{i}\n" for i in range(8)}
