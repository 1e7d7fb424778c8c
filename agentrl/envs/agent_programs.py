"""Running an agent program for one episode: a Python entrypoint, or any command.

An entrypoint is ``async def run(client, task) -> float | dict`` called with an
``openai.AsyncOpenAI`` bound to the episode's base URL and key. A command is started in
its own process group with a scrubbed environment (``PATH``, ``LANG``, a private ``HOME``
and ``TMPDIR``, the ``OPENAI_*`` and ``ANTHROPIC_*`` variables and the option's ``env``), gets the task as
JSON on stdin and prints its result as JSON on the last line of stdout. Whatever happens
(normal end, crash, timeout, cancellation) the whole process group is killed and the
private folder removed before the episode ends.

Failures of the program (an exception, a non-zero exit, no result) raise
:class:`~agentrl.errors.InfraError`: the episode is retried and then masked, like any
infrastructure failure; other episodes go on.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

import anyio

from agentrl.errors import ConfigError, InfraError, PluginError
from agentrl.registry import load_object

KILL_WAIT_S = 5.0
STDERR_TAIL = 2000


class ProgramFailed(InfraError):
    """A program that exited with an error after it ran, with what its episode can still be
    scored on (`result`: a workspace's graded diff). The run layer scores it when the
    program made model calls (the model's behaviour may be why it stopped: a harness
    that quits on a reply cut at max_tokens), else it is an infrastructure failure."""

    def __init__(self, message: str, result: Any) -> None:
        super().__init__(message)
        self.result = result


def load_entrypoint(target: str) -> Any:
    """The ``async def run(client, task)`` that `target` names (ConfigError otherwise)."""
    try:
        fn = load_object(target, "agent entrypoint")
    except PluginError as e:
        raise ConfigError(f"env.options.entrypoint={target!r}: {e}") from None
    if not inspect.iscoroutinefunction(fn):
        raise ConfigError(
            f"env.options.entrypoint={target!r} is {fn!r}, not an async function; it must be "
            "'async def run(client, task)' returning a reward (float or dict)"
        )
    return fn


async def run_entrypoint(fn: Any, client: Any, task: dict[str, Any]) -> Any:
    """Call the agent; an exception in it is the episode's infrastructure failure."""
    try:
        return await fn(client, dict(task))
    except Exception as e:
        raise InfraError(f"agent {getattr(fn, '__name__', fn)!r} raised {e!r}") from e


def _argv(
    options: Any,
    home: str,
    env: dict[str, str],
    values: dict[str, str],
    workspace: Workspace | None = None,
) -> list[str]:
    argv = [_fill(a, values) for a in options.command]
    if options.sandbox == "bwrap" and "/" in argv[0] and not os.path.isabs(argv[0]):
        # a relative program path is the host's (from cwd); the sandbox may chdir elsewhere
        argv[0] = os.path.abspath(os.path.join(options.cwd or os.getcwd(), argv[0]))
    if options.memory_mb is not None and shutil.which("prlimit"):
        argv = ["prlimit", f"--as={options.memory_mb * 1024 * 1024}", "--", *argv]
    if options.sandbox == "bwrap":
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise ConfigError(
                "env.options.sandbox=bwrap needs bubblewrap (apt-get install bubblewrap), or "
                "use sandbox: process"
            )
        box = [bwrap, "--unshare-all", "--share-net", "--die-with-parent", "--new-session"]
        box += [*_host_view(workspace), "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        box += ["--bind", home, home, "--clearenv"]
        for k, v in env.items():
            box += ["--setenv", k, v]
        cwd = options.cwd or os.getcwd()
        if workspace is not None:  # the episode's fork, where the task's prompt says it is
            box += ["--bind", workspace.host_path, workspace.path]
            cwd = workspace.path
        box += ["--chdir", cwd, "--"]
        argv = box + argv
    return argv


@dataclass(frozen=True)
class Workspace:
    """An episode's repository: `host_path` on the host, bound at `path` in the sandbox;
    `prompt` is the task as the program reads it (``{prompt}`` in its argv)."""

    host_path: str
    path: str
    prompt: str


def _host_view(workspace: Workspace | None) -> list[str]:
    """The host read-only: the whole of / at once, or with a workspace to mount (at a path
    / may lack, e.g. /repo) each top-level entry on bubblewrap's own root."""
    if workspace is None:
        return ["--ro-bind", "/", "/"]
    top = workspace.path.strip("/").split("/")[0]
    args: list[str] = []
    for name in sorted(os.listdir("/")):
        path = "/" + name
        if name in ("proc", "dev", "tmp", top):
            continue
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def _fill(arg: str, values: dict[str, str]) -> str:
    """An argv entry or env value with its placeholders filled: ``{python}`` (alone),
    ``{base_url}``, ``{api_key}``, ``{model}`` (the episode's session), and with a
    workspace ``{prompt}`` and ``{workspace}``; other braces are left as written."""
    if arg == "{python}":
        return sys.executable
    for key, value in values.items():
        arg = arg.replace("{" + key + "}", value)
    return arg


async def run_command(
    options: Any,
    task: dict[str, Any],
    base_url: str,
    api_key: str,
    model: str,
    workspace: Workspace | None = None,
) -> Any:
    """Run ``options.command`` for one episode; returns its parsed JSON result, or with a
    `workspace` (graded by its diff, not by what the program prints) its stdout's tail.
    A workspace episode's program gets no task on stdin: the task holds the hidden tests."""
    home = tempfile.mkdtemp(prefix="agentrl-agent-")
    values = {"base_url": base_url, "api_key": api_key, "model": model}
    if workspace is not None:
        values |= {"prompt": workspace.prompt, "workspace": workspace.path}
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "HOME": home,
        "TMPDIR": home,
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": api_key,
        "OPENAI_MODEL": model,
        # the same session for Anthropic clients (they append /v1/messages themselves)
        "ANTHROPIC_BASE_URL": base_url.removesuffix("/v1"),
        "ANTHROPIC_API_KEY": api_key,
        **{k: _fill(v, values) for k, v in options.env.items()},
    }
    cap = options.max_output_bytes
    try:
        argv = _argv(options, home, env, values, workspace)
        try:
            proc = await anyio.open_process(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=options.cwd,
                start_new_session=True,  # its own process group: killed as one
            )
        except OSError as e:
            raise InfraError(f"agent command {argv[0]!r} could not start: {e}") from e
        out, err = bytearray(), bytearray()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_drain, proc.stdout, out, cap)
                tg.start_soon(_drain, proc.stderr, err, cap)
                assert proc.stdin is not None
                try:
                    if workspace is None:
                        await proc.stdin.send(json.dumps(task).encode() + b"\n")
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    pass  # the program does not read its task: its choice
                await proc.stdin.aclose()
                await proc.wait()
        finally:
            await _kill_group(proc)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    stderr = err.decode(errors="replace")[-STDERR_TAIL:]
    if not stderr.strip():  # many CLIs print their errors on stdout
        stderr = out.decode(errors="replace")[-STDERR_TAIL:]
    if proc.returncode != 0:
        raise InfraError(
            f"agent command {options.command[0]!r} exited with status {proc.returncode}"
            + (f": {stderr.strip()}" if stderr.strip() else "")
        )
    if workspace is not None:
        return out.decode(errors="replace")[-STDERR_TAIL:]
    return parse_result(out.decode(errors="replace"), options.command[0])


def parse_result(stdout: str, program: str) -> Any:
    """The JSON on the last non-empty line of a command's stdout."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise InfraError(
            f"agent command {program!r} printed nothing: print its result as JSON on the last "
            'line of stdout (a number or {"reward": ...})'
        )
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError:
        raise InfraError(
            f"agent command {program!r} ended with {lines[-1][:200]!r}, not JSON: print its "
            'result as JSON on the last line of stdout (a number or {"reward": ...})'
        ) from None


async def _drain(stream: Any, into: bytearray, cap: int) -> None:
    """Read a pipe to its end, keeping the last `cap` bytes."""
    if stream is None:
        return
    try:
        async for chunk in stream:
            into.extend(chunk)
            if len(into) > cap:
                del into[: len(into) - cap]
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass


async def _kill_group(proc: Any) -> None:
    """Kill the program's process group (it and everything it started), then reap it."""
    with anyio.CancelScope(shield=True):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        with anyio.move_on_after(KILL_WAIT_S):
            await proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                try:
                    await stream.aclose()
                except Exception:  # already closed or broken: nothing to release
                    pass
