"""Tools on a repository workspace: ``shell``, ``view`` and ``edit``, all inside a sandbox.

The workspace is a host directory (an episode's fork, ``agentrl.envs.coding.workspace``)
that a per-episode sandbox binds read-write at ``/repo``; nothing of the host is touched by
the agent's calls, every file operation runs inside the sandbox. The three tools share one
:class:`WorkspaceHandle`, whose sandbox and session open on the first call and close with
the episode's :class:`ToolContext`.

    handle = WorkspaceHandle(limits={"timeout_s": 20})
    handle.host_path = "/tmp/agentrl-repo-x/ws-1"     # set by the environment's reset
    tools = [ShellTool(handle), ViewTool(handle), EditTool(handle)]
"""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from agentrl.errors import InfraError
from agentrl.sandbox import StartPace, create_sandbox, shared_pace
from agentrl.tools.base import Tool, ToolContext, ToolOutput
from agentrl.tools.python import failure, format_result

INSIDE = "/repo"
_SESSION_KEY = "workspace.session"


@dataclass
class WorkspaceHandle:
    """Where the episode's workspace is and how its sandbox is limited."""

    limits: dict[str, Any] = field(default_factory=dict)
    host_path: str | None = None
    timeout_s: float = 20.0
    max_output_chars: int = 3000

    async def run(self, ctx: ToolContext, code: str) -> ToolOutput:
        """Run ``code`` in the episode's sandbox session; its result as an observation."""
        if self.host_path is None:
            raise InfraError("the workspace tools ran before the environment's reset")
        try:
            pace = await shared_pace(ctx, self.limits)
            state: _Session = await ctx.get_or_create(
                _SESSION_KEY, lambda stack: self._open(stack, pace)
            )
            res = await state.session.run(code, timeout=self.timeout_s + 5.0)
        except InfraError as e:
            return ToolOutput(f"error: the sandbox failed: {e}", infra_error=True)
        if res.status == "sandbox_error":
            return ToolOutput("error: the sandbox failed", infra_error=True)
        text = format_result(res, self.timeout_s + 5.0, self.max_output_chars)
        return ToolOutput(text, error=failure(res))

    async def _open(self, stack: AsyncExitStack, pace: StartPace | None) -> _Session:
        limits = {
            "pool_size": 0,
            "max_sessions": 1,
            "timeout_s": self.timeout_s + 5.0,
            "label": "repo",
            **self.limits,
            "rw_binds": (f"{self.host_path}:{INSIDE}",),
        }
        sandbox = create_sandbox(backend="auto", pace=pace, **limits)
        stack.push_async_callback(sandbox.close)
        session = await stack.enter_async_context(sandbox.session())
        return _Session(session)


@dataclass
class _Session:
    session: Any


class ShellArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: str = Field(description="a shell command, run in the repository (/repo)")


class ViewArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="a file, relative to the repository root")
    start: int = Field(1, ge=1, description="first line shown")
    end: int | None = Field(None, ge=1, description="last line shown (default: 200 lines on)")


class EditArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="a file, relative to the repository root")
    old: str = Field(
        description="the exact text to replace (once in the file); '' writes new as the whole file"
    )
    new: str = Field(description="the replacement text")


class ShellTool(Tool):
    """Run a shell command in the repository; its output and exit status come back."""

    name: ClassVar[str] = "shell"
    description: ClassVar[str] = (
        "Run a shell command in the repository root (/repo), e.g. ls, cat, grep -n, "
        "python -c. Returns stdout, stderr and a non-zero exit status."
    )
    Args: ClassVar[type[BaseModel]] = ShellArgs
    sequential: ClassVar[bool] = True

    def __init__(self, handle: WorkspaceHandle) -> None:
        self.handle = handle
        self.timeout = handle.timeout_s + 60.0  # the sandbox may start first

    async def call(self, args: BaseModel, ctx: ToolContext) -> ToolOutput:
        command = args.command  # type: ignore[attr-defined]
        code = f"""\
import subprocess as _sp
try:
    _r = _sp.run(["/bin/sh", "-c", {command!r}], cwd={INSIDE!r}, stdin=_sp.DEVNULL,
                 timeout={self.handle.timeout_s!r})
    if _r.returncode:
        print(f"(exit status {{_r.returncode}})", flush=True)
except _sp.TimeoutExpired:
    print("error: the command timed out after {self.handle.timeout_s:g}s", flush=True)
"""
        return await self.handle.run(ctx, code)


class ViewTool(Tool):
    """Show a file of the repository with line numbers."""

    name: ClassVar[str] = "view"
    description: ClassVar[str] = "Show lines of a file in the repository, with line numbers."
    Args: ClassVar[type[BaseModel]] = ViewArgs
    sequential: ClassVar[bool] = True

    def __init__(self, handle: WorkspaceHandle) -> None:
        self.handle = handle
        self.timeout = handle.timeout_s + 60.0

    async def call(self, args: BaseModel, ctx: ToolContext) -> ToolOutput:
        a: ViewArgs = args  # type: ignore[assignment]
        end = a.end if a.end is not None else a.start + 199
        code = f"""\
import os as _os
_p = _os.path.join({INSIDE!r}, {a.path!r})
try:
    with open(_p, encoding="utf-8", errors="replace") as _f:
        _lines = _f.read().splitlines()
except OSError as _e:
    print(f"error: {{_e.strerror}}: {a.path}")
else:
    for _i in range({a.start - 1}, min({end}, len(_lines))):
        print(f"{{_i + 1:5d}}  {{_lines[_i]}}")
    if not _lines:
        print("(empty file)")
"""
        return await self.handle.run(ctx, code)


class EditTool(Tool):
    """Replace one exact piece of text in a file (or write a whole file)."""

    name: ClassVar[str] = "edit"
    description: ClassVar[str] = (
        "Edit a file in the repository: replace the exact text `old` (it must occur once) "
        "with `new`; with old '' the file is written with `new` as its whole content."
    )
    Args: ClassVar[type[BaseModel]] = EditArgs
    sequential: ClassVar[bool] = True

    def __init__(self, handle: WorkspaceHandle) -> None:
        self.handle = handle
        self.timeout = handle.timeout_s + 60.0

    async def call(self, args: BaseModel, ctx: ToolContext) -> ToolOutput:
        a: EditArgs = args  # type: ignore[assignment]
        payload = json.dumps({"path": a.path, "old": a.old, "new": a.new})
        # written to a new file and renamed: a file shared with other forks is copied up
        code = f"""\
import json as _json, os as _os
_a = _json.loads({payload!r})
_p = _os.path.join({INSIDE!r}, _a["path"])
try:
    if _a["old"] == "":
        _text = _a["new"]
    else:
        with open(_p, encoding="utf-8") as _f:
            _text = _f.read()
        _n = _text.count(_a["old"])
        if _n != 1:
            raise ValueError(f"`old` occurs {{_n}} times in {{_a['path']}}; it must occur once")
        _text = _text.replace(_a["old"], _a["new"])
    _os.makedirs(_os.path.dirname(_p) or ".", exist_ok=True)
    with open(_p + ".edit-tmp", "w", encoding="utf-8") as _f:
        _f.write(_text)
    _os.replace(_p + ".edit-tmp", _p)
    print(f"edited {{_a['path']}}")
except (OSError, ValueError) as _e:
    print(f"error: {{_e}}")
"""
        return await self.handle.run(ctx, code)
