"""The python tool on the real sandbox: state across calls, errors, limits, infra failures."""

from __future__ import annotations

import os
import uuid

import pytest

from agentrl.resources import ResourceScope
from agentrl.sandbox import SandboxResult, create_sandbox
from agentrl.sandbox.backends import BwrapBackend
from agentrl.sandbox.limits import SandboxLimits
from agentrl.tools import (
    PythonTool,
    ToolContext,
    prepare_calls,
    run_tool_calls,
)
from agentrl.tools.python import format_result, truncate
from tests.procs import live_descendants
from tests.waiting import wait_until_async

BWRAP_PROBLEM = BwrapBackend().problem(SandboxLimits())
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=f"bwrap: {BWRAP_PROBLEM}"),
]


@pytest.fixture
async def sandbox():
    sb = create_sandbox(pool_size=1, label=f"tooltest-{uuid.uuid4().hex[:8]}")
    yield sb
    await sb.close()


async def py(tool: PythonTool, ctx: ToolContext, code: str) -> str:
    from agentrl.tools.python import PythonArgs

    out = await tool.call(PythonArgs(code=code), ctx)
    assert not out.infra_error, out.text
    return out.text


async def test_state_persists_within_an_episode_not_across(sandbox):
    tool = PythonTool(sandbox, timeout=5)
    async with ToolContext() as ctx:
        assert (
            await py(tool, ctx, "import math\nx = 41") == "(no output; use print() to see values)"
        )
        assert await py(tool, ctx, "x += 1\nprint(x, math.sqrt(16))") == "42 4.0"
        assert await py(tool, ctx, "def f(n): return n * x\nprint(f(2))") == "84"
    async with ToolContext() as ctx:  # a new episode gets a fresh interpreter
        text = await py(tool, ctx, "print(x)")
        assert text.splitlines()[-1] == "NameError: name 'x' is not defined"


async def test_error_shows_traceback_tail_and_output(sandbox):
    tool = PythonTool(sandbox, timeout=5)
    async with ToolContext() as ctx:
        code = "print('before')\ndef f(n):\n    return f(n - 1) if n else 1 / 0\nf(30)"
        text = await py(tool, ctx, code)
    lines = text.splitlines()
    assert lines[0] == "before"
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "ZeroDivisionError: division by zero"
    assert len(lines) <= 9 and "^" not in text


async def test_long_output_is_truncated_with_a_marker(sandbox):
    tool = PythonTool(sandbox, timeout=5, max_output_chars=500)
    async with ToolContext() as ctx:
        text = await py(tool, ctx, "for i in range(2000): print(i)")
    assert len(text) <= 500
    assert text.startswith("0\n1\n2\n") and text.endswith("1998\n1999")
    assert "characters truncated]..." in text


async def test_timeout_says_state_is_lost_and_next_call_works(sandbox):
    tool = PythonTool(sandbox, timeout=1)
    async with ToolContext() as ctx:
        await py(tool, ctx, "y = 5")
        text = await py(tool, ctx, "while True: pass")
        assert text.splitlines() == [
            "error: execution timed out after 1s",
            "note: the interpreter was restarted; variables defined so far are lost",
        ]
        text = await py(tool, ctx, "print('y' in globals())")
        assert text == "False\nnote: this ran in a fresh interpreter; earlier variables are lost"


async def test_sandbox_failure_is_an_infra_error(sandbox):
    tool = PythonTool(sandbox, timeout=5)
    async with ToolContext() as ctx:
        await py(tool, ctx, "z = 1")
        await sandbox.close()  # the platform loses the sandbox mid-episode
        prepared = prepare_calls(
            '<tool_call>{"name": "python", "arguments": {"code": "print(z)"}}</tool_call>', [tool]
        )
        (result,) = await run_tool_calls(prepared, ctx)
    assert result.record.infra_error
    assert result.message["content"].startswith("error: the sandbox failed: ")


async def test_session_is_closed_when_the_episode_ends():
    sb = create_sandbox(pool_size=0)  # no warm interpreters: only the session's runs
    try:
        tool = PythonTool(sb, timeout=5)
        before = live_descendants(os.getpid())
        async with ToolContext() as ctx:
            await py(tool, ctx, "print(1)")
            during = live_descendants(os.getpid())
            assert during - before  # the session's interpreter (and its bwrap parent)
        # reaped asynchronously: wait for the OS to take them
        await wait_until_async(
            lambda: not (live_descendants(os.getpid()) & (during - before)),
            "the session's processes reaped",
            interval=0.05,
        )
    finally:
        await sb.close()


async def test_lazily_created_sandbox_lives_in_the_run_scope():
    """Episodes of one run share the sandbox; the run's scope closes it, not a global."""
    a, b = PythonTool(timeout=5, pool_size=0), PythonTool(timeout=5, pool_size=0)
    async with ResourceScope("run") as run:
        with run.active():
            async with ToolContext() as ctx:
                await py(a, ctx, "v = 3")
                assert await py(b, ctx, "print(v)") == "3"  # same episode: same session
            async with ToolContext() as other_episode:
                sb = await a._get_sandbox(other_episode)
                assert await b._get_sandbox(other_episode) is sb
                await py(a, other_episode, "print(1)")
                assert not sb.closed
    assert sb.closed


async def test_without_a_run_scope_the_sandbox_closes_with_the_episode():
    tool = PythonTool(timeout=5, pool_size=0)
    async with ToolContext() as ctx:
        assert await py(tool, ctx, "print(2)") == "2"
        sb = await tool._get_sandbox(ctx)
    assert sb.closed


# --- formatting (pure functions over sandbox results) ---------------------------------------


def result(
    status: str, stdout: str = "", stderr: str = "", state_lost: bool = False
) -> SandboxResult:
    return SandboxResult(stdout, stderr, 0, status, 0.1, 0.1, state_lost=state_lost)  # type: ignore[arg-type]


def test_format_limits():
    assert format_result(result("memory", "partial\n"), 5, 2000) == (
        "partial\nerror: memory limit exceeded\n"
        "note: the interpreter was restarted; variables defined so far are lost"
    )
    assert format_result(result("ok", "", "warning: x\n"), 5, 2000) == "warning: x"
    assert format_result(result("ok", "a", "b"), 5, 2000) == "a\nb"


def test_truncate_keeps_head_and_tail():
    text = "".join(f"{i:04d}\n" for i in range(1000))
    cut = truncate(text, 300)
    assert len(cut) <= 300 and cut.startswith("0000\n") and cut.endswith("0999\n")
    n = int(cut.split("...[")[1].split(" ")[0])
    assert len(cut) - len(f"\n...[{n} characters truncated]...\n") + n == len(text)
    assert truncate("short", 300) == "short"


def test_bad_limits_fail_at_construction(sandbox=None):
    from agentrl.errors import ConfigError

    with pytest.raises(ConfigError, match="did you mean 'memory_mb'"):
        PythonTool(memory_md=256)
    with pytest.raises(ValueError, match="timeout must be > 0"):
        PythonTool(timeout=0)


async def test_a_failed_run_is_recorded_as_the_calls_error(sandbox):
    """An exception in the code (not in the tool) is still a failed call: the trace records
    its last line as the call's error, and a successful call has none."""
    tool = PythonTool(sandbox, timeout=5)
    text = (
        '<tool_call>{"name": "python", "arguments": {"code": "print(1"}}</tool_call>\n'
        '<tool_call>{"name": "python", "arguments": {"code": "print(2)"}}</tool_call>'
    )
    calls = prepare_calls(text, [tool])
    async with ToolContext() as ctx:
        bad, good = [r.record for r in await run_tool_calls(calls, ctx)]
    assert bad.error is not None and bad.error.startswith("SyntaxError")
    assert "Traceback" in bad.result or "SyntaxError" in bad.result
    assert good.error is None and good.result == "2"
