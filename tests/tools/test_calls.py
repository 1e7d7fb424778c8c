"""Running a turn's calls: concurrency, per-tool timeouts, infra vs agent failures, order."""

from __future__ import annotations

import json

import anyio
import pytest
from pydantic import BaseModel, ConfigDict

from agentrl.errors import SandboxError, ToolError
from agentrl.tools import Tool, ToolContext, ToolOutput, prepare_calls, run_tool_calls, summarize

pytestmark = pytest.mark.anyio


class SleepArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seconds: float
    tag: str = ""


class Sleep(Tool):
    """Sleeps, then reports; records the order calls finished in."""

    name = "sleep"
    description = "sleep"
    Args = SleepArgs
    timeout = 0.5

    def __init__(self) -> None:
        self.finished: list[str] = []

    async def call(self, args: BaseModel, ctx: ToolContext) -> ToolOutput:
        # allow-sleep: the tool's work is a delay, what the timeout and order tests act on
        await anyio.sleep(args.seconds)  # type: ignore[attr-defined]
        self.finished.append(args.tag)  # type: ignore[attr-defined]
        return ToolOutput(f"slept {args.seconds}")  # type: ignore[attr-defined]


class Ordered(Sleep):
    name = "ordered"
    sequential = True


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Failing(Tool):
    name = "failing"
    description = "fails in a configurable way"
    Args = NoArgs

    def __init__(self, exc: BaseException | None = None, infra_output: bool = False) -> None:
        self.exc, self.infra_output = exc, infra_output

    async def call(self, args: BaseModel, ctx: ToolContext) -> ToolOutput:
        if self.exc is not None:
            raise self.exc
        return ToolOutput("backend down", infra_error=self.infra_output)


def calls(*items: tuple[str, dict]) -> str:
    return "".join(
        f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>" for n, a in items
    )


async def run(text: str, tools: list[Tool], timeout: float | None = None):
    async with ToolContext() as ctx:
        return await run_tool_calls(prepare_calls(text, tools), ctx, timeout=timeout)


class Rendezvous(Tool):
    """Returns only once every expected call has started (so calls run one at a time
    never return: the tool's timeout turns that into an error), and after the call
    named in ``after`` finished."""

    name = "rendezvous"
    description = "meet"
    Args = SleepArgs  # seconds: unused
    timeout = 60.0  # only reached when the calls do not overlap: then the test fails

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.started: list[str] = []
        self.finished: list[str] = []
        self.all_started = anyio.Event()
        self.done: dict[str, anyio.Event] = {}

    async def call(self, args: BaseModel, ctx: ToolContext) -> ToolOutput:
        tag = args.tag  # type: ignore[attr-defined]
        self.done.setdefault(tag, anyio.Event())
        self.started.append(tag)
        if len(self.started) == self.expected:
            self.all_started.set()
        await self.all_started.wait()
        if tag == "a":  # a finishes after b, to show results keep the call order
            await self.done.setdefault("b", anyio.Event()).wait()
        self.finished.append(tag)
        self.done[tag].set()
        return ToolOutput(f"met {tag}")


async def test_calls_run_concurrently_and_results_keep_call_order():
    tool = Rendezvous(expected=2)
    text = calls(
        ("rendezvous", {"seconds": 0, "tag": "a"}), ("rendezvous", {"seconds": 0, "tag": "b"})
    )
    results = await run(text, [tool])
    assert [r.record.error for r in results] == [None, None]  # both met: they overlapped
    assert tool.finished == ["b", "a"]
    assert [r.message["content"] for r in results] == ["met a", "met b"]
    # each call's latency is recorded; a's spans b's
    # allow-clock: an order the rendezvous forces (a ends after b), not a bound on either
    assert results[0].record.latency_s >= results[1].record.latency_s > 0
    assert all(r.message["role"] == "tool" and r.message["name"] == "rendezvous" for r in results)


async def test_sequential_tools_run_in_call_order():
    tool = Ordered()
    text = calls(
        ("ordered", {"seconds": 0.15, "tag": "a"}), ("ordered", {"seconds": 0.0, "tag": "b"})
    )
    results = await run(text, [tool])
    assert tool.finished == ["a", "b"]
    assert [r.record.error for r in results] == [None, None]


async def test_timeout_is_an_error_observation_and_counted():
    tool = Sleep()
    text = calls(("sleep", {"seconds": 5}), ("sleep", {"seconds": 0.01, "tag": "fast"}))
    results = await run(text, [tool])
    assert tool.finished == ["fast"]  # the slow call was cut off at its timeout, not awaited
    slow, fast = results
    assert slow.message["content"] == "error: tool 'sleep' timed out after 0.5s"
    assert slow.record.timed_out and not slow.record.infra_error
    assert fast.record.error is None
    counts = summarize(r.record for r in results)
    assert counts == {"tool_calls": 2, "tool_errors": 1, "tool_timeouts": 1, "tool_infra_errors": 0}


async def test_timeout_override():
    results = await run(calls(("sleep", {"seconds": 0.3})), [Sleep()], timeout=0.05)
    assert results[0].record.timed_out
    assert "timed out after 0.05s" in results[0].message["content"]


@pytest.mark.parametrize("exc", [SandboxError("kernel died"), ToolError("service unreachable")])
async def test_platform_failures_set_the_infra_flag(exc):
    (result,) = await run(calls(("failing", {})), [Failing(exc)])
    assert result.record.infra_error
    assert result.message["content"] == f"error: tool 'failing' is unavailable: {exc}"


async def test_infra_output_sets_the_flag():
    (result,) = await run(calls(("failing", {})), [Failing(infra_output=True)])
    assert result.record.infra_error and result.record.error == "backend down"


async def test_tool_bug_is_an_observation_not_a_crash():
    (result,) = await run(calls(("failing", {})), [Failing(ValueError("bad index 3"))])
    assert not result.record.infra_error
    assert result.message["content"] == "error: tool 'failing' failed: ValueError: bad index 3"


async def test_invalid_calls_are_reported_without_running():
    tool = Sleep()
    text = calls(("sleep", {}), ("slep", {"seconds": 0})) + "<tool_call>{oops</tool_call>"
    results = await run(text, [tool])
    assert tool.finished == []
    assert [r.record.name for r in results] == ["sleep", "slep", ""]
    assert [r.message["content"] for r in results] == [
        "error: argument 'seconds' is required",
        "error: unknown tool 'slep' (did you mean 'sleep'?)",
        "error: invalid JSON in tool call: Expecting property name enclosed in double quotes at line 1 column 2",
    ]
    assert summarize(r.record for r in results)["tool_errors"] == 3


async def test_cancellation_propagates():
    tool = Sleep()
    tool.timeout = 10
    with anyio.move_on_after(0.1) as scope:
        await run(calls(("sleep", {"seconds": 5})), [tool])
    assert scope.cancelled_caught
