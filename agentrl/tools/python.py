"""The ``python`` tool: a stateful interpreter in a sandbox session that lives for the episode.

The :class:`~agentrl.sandbox.Sandbox` is shared by every episode of a run: pass one in, or
one is created on first use with ``create_sandbox(backend="auto", **sandbox_limits)`` in
the run's resource scope (:meth:`ToolContext.run_resource`), which closes it when the run
ends; outside a run it lives in the episode's own scope. Each episode gets its own
session through :meth:`ToolContext.get_or_create`, closed when the episode ends.

What the model sees: stdout, then stderr (for an exception, the traceback's last lines),
truncated to ``max_output_chars`` keeping the head and the tail around a
``...[N characters truncated]...`` marker; then one line per limit hit
(``error: execution timed out after 10s``, ``error: memory limit exceeded``, ...) and
``note: the interpreter restarted ...`` when earlier state was lost. Code that prints
nothing gets ``(no output; use print() to see values)``. A failure of the sandbox itself
returns ``ToolOutput(infra_error=True)`` and drops the session (the next call starts a
fresh one and says so).
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from agentrl.errors import InfraError
from agentrl.sandbox import SandboxLimits, create_sandbox
from agentrl.tools.base import Tool, ToolContext, ToolOutput

RESTART_STATUSES = frozenset({"timeout", "memory", "output_limit", "killed"})
TRACEBACK_LINES = 6  # lines of a traceback shown (the last ones: where and what)
_SESSION_KEY = "python.session"


class PythonArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: str = Field(
        description="Python code to run. Variables and imports persist between calls; "
        "print() the values you want to see."
    )


class PythonTool(Tool):
    """Run Python code in a persistent sandboxed interpreter.

    ``timeout``: seconds the code may run per call; the call as a whole (including
    starting the sandbox session) may take ``timeout + startup_grace_s``.
    """

    name: ClassVar[str] = "python"
    description: ClassVar[str] = (
        "Run Python code in a persistent interpreter and return what it prints "
        "(stdout and stderr). Variables and imports persist across calls."
    )
    Args: ClassVar[type[BaseModel]] = PythonArgs
    sequential: ClassVar[bool] = True

    def __init__(
        self,
        sandbox: Any | None = None,
        *,
        timeout: float = 10.0,
        max_output_chars: int = 2000,
        startup_grace_s: float = 30.0,
        **sandbox_limits: Any,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds (got {timeout})")
        if max_output_chars < 100:
            raise ValueError(f"max_output_chars must be >= 100 (got {max_output_chars})")
        if sandbox is None:  # bad limits are a config error now, not a failed call later
            SandboxLimits.build(**sandbox_limits)
        elif sandbox_limits:
            raise ValueError(
                "pass sandbox limits to create_sandbox() when giving a sandbox "
                f"(got {', '.join(sandbox_limits)})"
            )
        self.sandbox = sandbox
        self.run_timeout = float(timeout)
        self.timeout = float(timeout) + startup_grace_s
        self.max_output_chars = max_output_chars
        self.sandbox_limits = sandbox_limits

    async def _get_sandbox(self, ctx: ToolContext) -> Any:
        if self.sandbox is not None:
            return self.sandbox

        async def open_sandbox(stack: AsyncExitStack) -> Any:
            sandbox = create_sandbox(backend="auto", **self.sandbox_limits)
            stack.push_async_callback(sandbox.close)
            return sandbox

        key = "python.sandbox:" + repr(sorted(self.sandbox_limits.items()))
        return await ctx.run_resource(key, open_sandbox)

    async def call(self, args: BaseModel, ctx: ToolContext) -> ToolOutput:
        code = args.code  # type: ignore[attr-defined]
        state: _EpisodeState = await ctx.get_or_create(_SESSION_KEY, _new_state)
        restarted = False
        try:
            if state.session is None:
                sandbox = await self._get_sandbox(ctx)
                state.session = await state.stack.enter_async_context(sandbox.session())
                restarted, state.lost = state.lost, False
            res = await state.session.run(code, timeout=self.run_timeout)
        except InfraError as e:
            state.session, state.lost = None, True
            return ToolOutput(f"error: the sandbox failed: {e}", infra_error=True)
        if res.status == "sandbox_error":
            state.session, state.lost = None, True
            detail = (res.stderr or "").strip().splitlines()[-1:] or ["no details"]
            return ToolOutput(
                f"error: the sandbox failed: {detail[0]}", data=_data(res), infra_error=True
            )
        text = format_result(res, self.run_timeout, self.max_output_chars, restarted=restarted)
        return ToolOutput(text, data=_data(res), error=failure(res))


@dataclass
class _EpisodeState:
    """One episode's interpreter: the session (None after a sandbox failure)."""

    stack: AsyncExitStack
    session: Any = None
    lost: bool = False  # a session died: the next one must say state was lost


async def _new_state(stack: AsyncExitStack) -> _EpisodeState:
    return _EpisodeState(stack)


def _data(res: Any) -> dict[str, Any]:
    return {
        "status": res.status,
        "exit_code": getattr(res, "exit_code", None),
        "state_lost": bool(getattr(res, "state_lost", False)),
    }


def failure(res: Any) -> str | None:
    """Why a run failed, in one line (the exception's last line, the limit it hit, the exit
    code); None when it succeeded."""
    code = getattr(res, "exit_code", None)
    if res.status == "ok" and not code:
        return None
    if res.status == "error":
        lines = [ln for ln in (res.stderr or "").strip().splitlines() if ln.strip()]
        return lines[-1][:200] if lines else f"error (exit code {code})"
    if res.status == "ok":
        return f"exit code {code}"
    return res.status  # timeout | memory | output_limit | killed


def format_result(res: Any, run_timeout: float, max_chars: int, restarted: bool = False) -> str:
    """The observation for one sandbox result (see the module doc)."""
    stdout, stderr = res.stdout or "", res.stderr or ""
    if res.status == "error":
        stderr = traceback_tail(stderr)
    body = stdout
    if stderr:
        body += ("" if not body or body.endswith("\n") else "\n") + stderr
    body = truncate(body.rstrip("\n"), max_chars)
    notes = []
    if restarted:
        notes.append("note: the interpreter was restarted; variables from earlier calls are lost")
    status_note = {
        "timeout": f"error: execution timed out after {run_timeout:g}s",
        "memory": "error: memory limit exceeded",
        "output_limit": "error: output limit exceeded (output truncated)",
        "killed": "error: the process was killed",
    }.get(res.status)
    if status_note:
        notes.append(status_note)
    if res.status in RESTART_STATUSES:
        notes.append("note: the interpreter was restarted; variables defined so far are lost")
    elif getattr(res, "state_lost", False) and not restarted:
        notes.append("note: this ran in a fresh interpreter; earlier variables are lost")
    if not body and not notes:
        return "(no output; use print() to see values)"
    return "\n".join([body, *notes] if body else notes)


def traceback_tail(stderr: str, lines: int = TRACEBACK_LINES) -> str:
    """Keep a traceback's header and its last ``lines`` lines."""
    # python 3.11+ underlines the failing expression; the carets cost chars and say little
    all_lines = [ln for ln in stderr.rstrip("\n").splitlines() if ln.strip(" ^~") or not ln]
    head = "Traceback (most recent call last):"
    if len(all_lines) <= lines + 1:
        return "\n".join(all_lines)
    tail = all_lines[-lines:]
    first = [head, "  ..."] if any(line.startswith(head) for line in all_lines) else ["..."]
    return "\n".join(first + tail)


def truncate(text: str, max_chars: int) -> str:
    """Head and tail of ``text`` around a marker saying how much was cut."""
    if len(text) <= max_chars:
        return text
    marker_room = 48
    keep = max(max_chars - marker_room, 0)
    head, tail = keep * 2 // 3, keep - keep * 2 // 3
    cut = len(text) - head - tail
    return f"{text[:head]}\n...[{cut} characters truncated]...\n{text[len(text) - tail :]}"
