"""Sessions, the warm pool and cleanup on every exit path (bwrap backend)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import anyio
import pytest

from agentrl.errors import ConfigError, SandboxError, SandboxUnavailableError
from agentrl.sandbox import SandboxLimits, create_sandbox
from tests.waiting import wait_until_async

from .conftest import descendants, needs_bwrap, processes_with, wait_gone

pytestmark = [pytest.mark.anyio, needs_bwrap]


async def test_state_persists_within_a_session_and_not_across(marker: str) -> None:
    async with create_sandbox(label=marker) as sb:
        assert sb.backend_name == "bwrap"
        async with sb.session() as s1, sb.session() as s2:
            assert (await s1.run("x = 41\nimport math")).status == "ok"
            r = await s1.run("print(x + 1, math.pi > 3)")
            assert (r.stdout, r.status, r.exit_code, r.state_lost) == ("42 True\n", "ok", 0, False)
            r2 = await s2.run("print(x)")
            assert r2.status == "error" and "NameError" in r2.stderr
        one = await sb.run("y = 5")
        two = await sb.run("print(y)")
        assert one.status == "ok" and two.status == "error"  # one-shot runs share nothing
    assert sb.live_processes == 0


async def test_result_fields(marker: str) -> None:
    async with create_sandbox(label=marker) as sb:
        r = await sb.run(
            "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsum(range(10**6))"
        )
        assert (r.stdout, r.stderr, r.status, r.exit_code) == ("out\n", "err\n", "ok", 0)
        assert r.wall_s > 0 and r.cpu_s >= 0 and not r.truncated and not r.state_lost
        assert set(r.to_dict()) >= {"stdout", "stderr", "exit_code", "status", "wall_s", "cpu_s"}


async def test_errors_exit_codes_and_syntax(marker: str) -> None:
    async with create_sandbox(label=marker) as sb, sb.session() as s:
        await s.run("keep = 1")
        r = await s.run("raise SystemExit(3)")
        assert (r.status, r.exit_code) == ("error", 3)
        r = await s.run("import sys\nsys.exit(0)")
        assert (r.status, r.exit_code) == ("ok", 0)
        r = await s.run("def broken(:\n  pass")
        assert r.status == "error" and "SyntaxError" in r.stderr
        r = await s.run("def g():\n    raise KeyError('k')\ng()")
        assert 'File "<cell-' in r.stderr and "raise KeyError" in r.stderr  # source lines shown
        assert (await s.run("print(keep)")).stdout == "1\n"  # none of that lost state
        r = await s.run("import os\nos._exit(4)")  # the interpreter itself exits
        assert (r.status, r.exit_code) == ("error", 4)
        r = await s.run("print('fresh')")
        assert r.state_lost and r.stdout == "fresh\n"


async def test_background_output_does_not_break_later_calls(marker: str) -> None:
    code = (
        "import threading, time, sys\n"
        "def chatter():\n"
        "    for _ in range(50):\n"
        "        print('bg'); time.sleep(0.005)\n"
        "threading.Thread(target=chatter, daemon=True).start()"
    )
    async with create_sandbox(label=marker) as sb, sb.session() as s:
        assert (await s.run(code)).status == "ok"
        for i in range(20):
            r = await s.run(f"print('call', {i})")
            assert r.status == "ok" and f"call {i}\n" in r.stdout


async def test_acquire_timeout_raises_sandbox_error(marker: str) -> None:
    async with create_sandbox(label=marker, max_sessions=1, acquire_timeout_s=0.3) as sb:
        async with sb.session() as s:
            await s.run("pass")
            t0 = time.perf_counter()  # allow-clock: acquire_timeout_s is itself a time limit
            with pytest.raises(SandboxError, match="acquire_timeout_s"):
                async with sb.session():
                    pass
            # allow-clock: the same limit (0.3 s; the slack is room for a loaded machine)
            assert time.perf_counter() - t0 < 0.3 + 10
        async with sb.session() as s:  # the slot came back
            assert (await s.run("print(1)")).stdout == "1\n"


async def test_cancelling_a_running_call_kills_it(marker: str) -> None:
    async with create_sandbox(label=marker) as sb, sb.session() as s:
        await s.run("x = 1")
        code = f"import subprocess, time\nsubprocess.Popen(['/usr/bin/python3', '-c', 'import time; time.sleep(99)', '{marker}-gc'])\ntime.sleep(100)"
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.run, code, 60)
            # the code is running (its child is up): cancel the call there
            await wait_until_async(lambda: processes_with(f"{marker}-gc"), "the code running")
            tg.cancel_scope.cancel()
        assert wait_gone(f"{marker}-gc") == []  # kernel and its child are gone
        r = await s.run("print('x' in globals())")
        assert r.status == "ok" and r.state_lost and r.stdout == "False\n"


async def test_cancelling_the_task_holding_a_session(marker: str) -> None:
    sb = create_sandbox(label=marker, max_sessions=2)
    try:
        async with anyio.create_task_group() as tg:

            async def episode(i: int) -> None:
                async with sb.session() as s:
                    # the child's argv says the code is running; the snippet then blocks
                    code = (
                        "import subprocess, time\n"
                        "subprocess.Popen(['/usr/bin/python3', '-c', 'import time; "
                        f"time.sleep(99)', '{marker}-ep{i}'])\ntime.sleep(100)"
                    )
                    await s.run(code, timeout=60)

            for i in range(2):
                tg.start_soon(episode, i)
            # both episodes are inside their calls (each code's child is up), then cancel
            await wait_until_async(
                lambda: all(processes_with(f"{marker}-ep{i}") for i in range(2)),
                "both episodes' code running",
            )
            tg.cancel_scope.cancel()
        assert wait_gone(f"{marker}-ep") == []  # the calls' processes went with them
        # both slots are free again and nothing of the cancelled episodes survives
        async with sb.session() as a, sb.session() as b:
            assert (await a.run("print(1)")).ok and (await b.run("print(2)")).ok
    finally:
        await sb.close()
    assert sb.live_processes == 0 and descendants(os.getpid()) == []


async def test_exception_in_the_episode_cleans_up(marker: str) -> None:
    sb = create_sandbox(label=marker, pool_size=0)
    with pytest.raises(RuntimeError):
        async with sb.session() as s:
            await s.run("x = 1")
            raise RuntimeError("episode failed")
    assert sb.live_processes == 0
    await sb.close()


async def test_close_kills_sessions_in_use(marker: str) -> None:
    sb = create_sandbox(label=marker)
    async with sb.session() as s:
        await s.run("x = 1")
        await sb.close()
        assert wait_gone(marker) == []
        with pytest.raises(SandboxError, match="closed"):
            await s.run("print(x)")
    with pytest.raises(SandboxError, match="closed"):
        await sb.run("pass")


def test_killing_the_host_process_kills_the_sandbox(marker: str) -> None:
    """The parent (our process) dies by SIGKILL: --die-with-parent takes everything down."""
    script = textwrap.dedent(
        f"""
        import anyio, sys
        from agentrl.sandbox import create_sandbox
        async def main():
            sb = create_sandbox(label={marker!r})
            async with sb.session() as s:
                r = await s.run("import subprocess\\nsubprocess.Popen(['/usr/bin/python3', '-c', 'import time; time.sleep(99)', {marker!r}], start_new_session=True)")
                assert r.ok, r
                print("READY", flush=True)
                # allow-sleep: the host's work is to hold the sandbox until it is SIGKILLed
                await anyio.sleep(100)
        anyio.run(main)
        """
    )
    host = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None
        assert host.stdout.readline().strip() == "READY"
        assert len(processes_with(marker)) >= 2  # the kernel and the grandchild are running
        os.kill(host.pid, signal.SIGKILL)
        host.wait(60)  # SIGKILL ends it; the bound only ends a hang
        assert wait_gone(marker) == []
    finally:
        host.kill()
        host.wait()


async def test_two_hundred_concurrent_sessions(marker: str) -> None:
    """200 sessions alive at once on a 2-core machine: no deadlock, no leak."""
    results: dict[int, str] = {}
    async with create_sandbox(
        label=marker, max_sessions=200, pool_size=4, acquire_timeout_s=120
    ) as sb:
        all_open = anyio.Event()
        opened = 0

        async def episode(i: int) -> None:
            nonlocal opened
            async with sb.session() as s:
                await s.run(f"x = {i}", timeout=60)
                opened += 1
                if opened == 200:
                    all_open.set()
                await all_open.wait()  # every session is alive at this point
                results[i] = (await s.run("print(x * 2)", timeout=60)).stdout

        with anyio.fail_after(150):
            async with anyio.create_task_group() as tg:
                for i in range(200):
                    tg.start_soon(episode, i)
    assert results == {i: f"{2 * i}\n" for i in range(200)}
    assert sb.live_processes == 0 and descendants(os.getpid()) == []


def test_limits_are_validated() -> None:
    with pytest.raises(ConfigError, match="memory_mb"):
        create_sandbox(memory_mb=1)
    with pytest.raises(ConfigError, match="did you mean 'memory_mb'"):
        create_sandbox(memroy_mb=512)
    with pytest.raises(SandboxUnavailableError, match="did you mean 'bwrap'"):
        create_sandbox("bwarp")
    with pytest.raises(SandboxUnavailableError, match="not found"):
        create_sandbox("bwrap", python="/nope/python3")
    assert SandboxLimits().memory_mb == 1024


def test_create_sandbox_returns_quickly() -> None:
    sb = create_sandbox()
    assert sb.live_processes == 0  # nothing started yet: creating one is cheap


@pytest.mark.parametrize("cgroups", [True, False])
async def test_cancel_and_close_while_interpreters_are_still_starting(
    marker: str, cgroups: bool
) -> None:
    """Kills that land before bwrap has reported its namespace's init leave nothing behind."""
    sb = create_sandbox(label=marker, pool_size=2, cgroups=cgroups)
    try:
        for i in range(20):
            with anyio.move_on_after(0.002 * i):
                async with sb.session() as s:
                    await s.run("pass")
        sb._top_up()  # warm interpreters launched but never awaited
    finally:
        await sb.close()
    assert sb.live_processes == 0
    assert wait_gone(marker) == []


async def test_the_start_rate_holds_a_burst_of_sessions_to_its_pace(marker: str) -> None:
    # 6 fresh interpreters at 5 starts/s after a burst of 2: the last 4 each wait for the
    # bucket (>= 1/5 s apiece by the bucket's own account), however fast the host starts them
    limits = {"pool_size": 0, "max_starts_per_s": 5.0, "start_burst": 2}
    async with create_sandbox(label=marker, **limits) as sb:
        results = []

        async def one() -> None:
            results.append((await sb.run("print(1)")).stdout)

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(one)
        assert results == ["1\n"] * 6
        stats = sb.stats()
        assert stats["starts"] == 6 and stats["start_wait_s"] >= 0.75
    # unlimited (the default): nothing waits, and the warm pool serves the first session
    async with create_sandbox(label=marker, pool_size=1) as sb:
        await sb.warm_up()
        assert (await sb.run("print(2)")).stdout == "2\n"
        stats = sb.stats()
        assert stats["warm_hits"] == 1 and stats["start_wait_s"] == 0


def test_a_bad_start_rate_names_the_field() -> None:
    with pytest.raises(ConfigError, match="max_starts_per_s"):
        SandboxLimits.build(max_starts_per_s=-1)


async def test_sandboxes_sharing_a_pace_share_one_start_rate(marker: str) -> None:
    # per-episode sandboxes (a workspace each) take their starts from the run's one bucket:
    # 2 sandboxes x 3 starts at 5/s after a burst of 2 wait for 4 starts together
    from agentrl.sandbox import shared_pace
    from agentrl.tools.base import ToolContext

    limits = {"pool_size": 0, "max_starts_per_s": 5.0, "start_burst": 2}
    async with ToolContext() as ctx:
        pace = await shared_pace(ctx, limits)
        assert pace is not None and await shared_pace(ctx, limits) is pace
        assert await shared_pace(ctx, {"max_starts_per_s": 0}) is None
        async with (
            create_sandbox(label=marker, pace=pace, **limits) as a,
            create_sandbox(label=marker, pace=pace, **limits) as b,
            anyio.create_task_group() as tg,
        ):
            for sb in (a, b, a, b, a, b):
                tg.start_soon(sb.run, "pass")
        assert a.stats()["starts"] == b.stats()["starts"] == 3
        assert pace.waited_s >= 0.75  # 4 of the 6 starts waited >= 1/5 s each
