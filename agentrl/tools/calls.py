"""From model text to tool results: parse, validate, run concurrently, record.

    prepared = prepare_calls(text, tools, parser="hermes")
    if not prepared.attempted: ...            # no tool call: a final answer
    results = await run_tool_calls(prepared, ctx)
    observations = [r.message for r in results]   # role "tool" messages, in call order
    records = [r.record for r in results]         # agentrl.types.ToolCallRecord

Agent mistakes (bad JSON, unknown tool, bad arguments, a tool timing out, a tool bug)
become a short ``error: ...`` observation for that call. Platform failures (a tool raising
:class:`InfraError` / :class:`ToolError`, or returning ``ToolOutput(infra_error=True)``)
set ``record.infra_error`` so the episode can be marked ``infra_error``. Nothing here raises
into the rollout loop except cancellation.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from pydantic import BaseModel, ValidationError

from agentrl._suggest import suggest
from agentrl.errors import InfraError, ToolError
from agentrl.tools.base import Tool, ToolContext, ToolOutput
from agentrl.tools.parsers import MalformedCall, get_parser
from agentrl.types import ToolCallRecord


@dataclass
class PreparedCall:
    """One attempted call: validated (``args`` set) or rejected (``error`` set)."""

    name: str
    arguments: dict[str, Any] | str  # str: the raw text when it could not be read
    tool: Tool | None = None
    args: BaseModel | None = None
    error: str | None = None
    raw: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class PreparedCalls:
    """Every call a turn attempted, in order."""

    calls: list[PreparedCall] = field(default_factory=list)

    @property
    def attempted(self) -> bool:
        return bool(self.calls)

    @property
    def valid(self) -> list[PreparedCall]:
        return [c for c in self.calls if c.ok]

    @property
    def errors(self) -> list[str]:
        return [c.error for c in self.calls if c.error is not None]

    def __len__(self) -> int:
        return len(self.calls)

    def __iter__(self) -> Iterator[PreparedCall]:
        return iter(self.calls)


@dataclass
class ToolResult:
    """The outcome of one call: the trace record and the message shown to the model."""

    record: ToolCallRecord
    message: dict[str, Any]
    output: ToolOutput | None = None


def prepare_calls(text: str, tools: Iterable[Tool], parser: str = "hermes") -> PreparedCalls:
    """Parse ``text`` and validate each call against its tool's ``Args``."""
    by_name = {t.name: t for t in tools}
    prepared = PreparedCalls()
    for item in get_parser(parser)(text):
        if isinstance(item, MalformedCall):
            prepared.calls.append(PreparedCall("", item.raw, error=item.error, raw=item.raw))
            continue
        tool = by_name.get(item.name)
        if tool is None:
            hint = (
                suggest(item.name, by_name)
                or f" (available: {', '.join(sorted(by_name)) or 'none'})"
            )
            prepared.calls.append(
                PreparedCall(
                    item.name,
                    item.arguments,
                    error=f"error: unknown tool '{item.name}'{hint}",
                    raw=item.raw,
                )
            )
            continue
        args, error = validate_arguments(tool, item.arguments)
        prepared.calls.append(PreparedCall(item.name, item.arguments, tool, args, error, item.raw))
    return prepared


def validate_arguments(
    tool: Tool, arguments: dict[str, Any]
) -> tuple[BaseModel | None, str | None]:
    """``(args, None)`` or ``(None, "error: argument 'code' is required")``."""
    try:
        return tool.Args.model_validate(arguments), None
    except ValidationError as e:
        fields = list(tool.Args.model_fields)
        return None, "error: " + "; ".join(_describe(err, fields) for err in e.errors())


def _describe(err: Any, fields: list[str]) -> str:
    loc = ".".join(str(p) for p in err.get("loc", ())) or "arguments"
    kind = err.get("type", "")
    if kind == "missing":
        return f"argument '{loc}' is required"
    if kind == "extra_forbidden":
        hint = suggest(str(loc), fields) or f" (arguments: {', '.join(fields)})"
        return f"unknown argument '{loc}'{hint}"
    msg = str(err.get("msg", "is invalid"))
    msg = msg[:1].lower() + msg[1:]
    got = repr(err.get("input"))
    got = got if len(got) <= 40 else got[:37] + "..."
    return f"argument '{loc}': {msg} (got {got})"


async def run_tool_calls(
    calls: PreparedCalls | Sequence[PreparedCall],
    ctx: ToolContext,
    timeout: float | None = None,
) -> list[ToolResult]:
    """Run a turn's valid calls concurrently; one result per attempted call, in order.

    ``timeout`` overrides each tool's own ``timeout``. Calls to a tool with
    ``sequential = True`` (a stateful interpreter) run one after another in call order.
    """
    items = list(calls)
    results: list[ToolResult | None] = [None] * len(items)
    lanes: dict[str, list[int]] = {}  # sequential tools: one lane per tool name
    singles: list[int] = []
    for i, call in enumerate(items):
        if not call.ok or call.tool is None or call.args is None:
            results[i] = _error_result(call, call.error or "error: invalid tool call")
        elif call.tool.sequential:
            lanes.setdefault(call.name, []).append(i)
        else:
            singles.append(i)

    async def run_lane(indices: list[int]) -> None:
        for i in indices:
            results[i] = await _run_one(items[i], ctx, timeout)

    async with anyio.create_task_group() as tg:
        for lane in lanes.values():
            tg.start_soon(run_lane, lane)
        for i in singles:
            tg.start_soon(run_lane, [i])
    return [r for r in results if r is not None]


async def _run_one(call: PreparedCall, ctx: ToolContext, timeout: float | None) -> ToolResult:
    tool, name = call.tool, call.name
    assert tool is not None and call.args is not None
    limit = tool.timeout if timeout is None else timeout
    start = time.perf_counter()
    try:
        with anyio.fail_after(limit):
            out = await tool.call(call.args, ctx)
    except TimeoutError:
        res = _error_result(call, f"error: tool '{name}' timed out after {limit:g}s", _since(start))
        res.record.timed_out = True
        return res
    except (InfraError, ToolError) as e:
        res = _error_result(call, f"error: tool '{name}' is unavailable: {e}", _since(start))
        res.record.infra_error = True
        return res
    except Exception as e:  # a tool bug is reported to the agent, not raised into the loop
        return _error_result(
            call, f"error: tool '{name}' failed: {type(e).__name__}: {str(e)[:300]}", _since(start)
        )
    latency = time.perf_counter() - start
    record = ToolCallRecord(
        name=name,
        arguments=call.arguments,
        result=out.text,
        result_chars=len(out.text),
        latency_s=latency,
        error=out.text if out.infra_error else out.error,
        infra_error=out.infra_error,
    )
    return ToolResult(record, tool_message(name, out.text), out)


def _since(start: float) -> float:
    return time.perf_counter() - start


def _error_result(call: PreparedCall, error: str, latency: float = 0.0) -> ToolResult:
    record = ToolCallRecord(
        name=call.name,
        arguments=call.arguments,
        result=error,
        result_chars=len(error),
        latency_s=latency,
        error=error,
    )
    return ToolResult(record, tool_message(call.name, error))


def tool_message(name: str, content: str) -> dict[str, Any]:
    """The role ``tool`` message carrying one call's result."""
    return {"role": "tool", "name": name, "content": content}


def summarize(records: Iterable[ToolCallRecord]) -> dict[str, int]:
    """Counts for metrics: calls, errors, timeouts, infra errors."""
    out = {"tool_calls": 0, "tool_errors": 0, "tool_timeouts": 0, "tool_infra_errors": 0}
    for r in records:
        out["tool_calls"] += 1
        out["tool_errors"] += r.error is not None and not r.infra_error
        out["tool_timeouts"] += r.timed_out
        out["tool_infra_errors"] += r.infra_error
    return out
