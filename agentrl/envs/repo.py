"""repo: fix a bug in a small Python repository, graded by hidden tests (SWE-style).

Each episode works in its own fork of the task's prepared workspace
(``agentrl.envs.coding.workspace``: the repository written once per task; every sample of a
group and every ARPO branch forks it) bound at ``/repo`` in a per-episode sandbox, with
three tools: ``shell`` (a command in /repo), ``view`` (a file with line numbers) and
``edit`` (replace one exact text). A reply without a tool call ends the episode.

``reward()`` reads the workspace's diff against the ORIGINAL repository and grades it
(``agentrl.envs.coding.repo_tests``): the diff's changes to non-test files applied to a
clean copy, the hidden tests run in a fresh sandbox that never saw the workspace. 1 when
every listed test passes (``reward: all_pass``) or the fraction passed; the diff and each
test's result in ``reward_info``. A sandbox that cannot grade is an infrastructure error.

    env = make_env("repo")                                        # generated bug fixes
    env = make_env("repo", source="file", dataset_path="my_repos.jsonl")

``agentrl grade repo --task ID --answer FIX.diff`` scores a diff exactly like this.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import AsyncExitStack
from typing import Any, ClassVar, Literal

from pydantic import Field

from agentrl.envs.base import StepResult, ToolEnvironment
from agentrl.envs.coding.repo_diff import make_diff, read_tree
from agentrl.envs.coding.repo_tasks import generated_tasks, load_repo_tasks
from agentrl.envs.coding.repo_tests import RepoGrader, repo_size_mb
from agentrl.envs.coding.workspace import Workspace, prepared_for, workspace_root
from agentrl.envs.graded import FileSourceOptions, GradedInReward
from agentrl.errors import EnvError
from agentrl.sandbox import shared_pace
from agentrl.tools import prepare_calls
from agentrl.tools.base import ToolContext
from agentrl.tools.workspace import EditTool, ShellTool, ViewTool, WorkspaceHandle

INSTRUCTIONS = """\
You fix bugs in Python repositories. The repository is in /repo. Use the tools: shell runs \
a command there (ls, cat, grep -n, python -c ...), view shows a file with line numbers, \
edit replaces an exact piece of text in a file. Call a tool like this:
<tool_call>
{"name": "view", "arguments": {"path": "pkg/module.py"}}
</tool_call>
Hidden tests check your fix; test files you change are restored first. When the bug is \
fixed, reply DONE without a tool call."""

# One worked episode, given as earlier turns (small models copy the format of examples).
_EXAMPLE_PROMPT = (
    "The repository `demo` is in /repo. A user reports that `double` in `demo/util.py` "
    "gives wrong results; the project's tests for it (test_double) fail. Find the bug and "
    "fix the code.\n\nFiles in /repo:\ndemo/__init__.py\ndemo/util.py"
)
FEWSHOT: tuple[tuple[str, dict[str, str], str], ...] = (
    ("view", {"path": "demo/util.py"}, "    1  def double(x):\n    2      return x + 2"),
    (
        "edit",
        {"path": "demo/util.py", "old": "return x + 2", "new": "return x * 2"},
        "edited demo/util.py",
    ),
)


def tool_call_text(name: str, arguments: dict[str, str]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class RepoOptions(FileSourceOptions):
    file_holds: ClassVar[str] = "repository tasks"

    source: Literal["generated", "file"] = Field(
        "generated", description="tasks: generated bug fixes, or a JSONL of repositories"
    )
    dataset_path: str | None = Field(None, description="a JSONL of repository tasks (file)")
    size: int = Field(1000, ge=1, description="tasks per split (source: generated)")
    reward: Literal["all_pass", "fraction"] = "all_pass"
    test_timeout_s: float = Field(10.0, gt=0, description="one hidden test")
    grade_memory_mb: int = Field(512, ge=64, description="memory of a grading process")
    grade_concurrency: int = Field(8, ge=1, description="grading sandboxes alive at once")
    command_timeout_s: float = Field(20.0, gt=0, description="one tool call in the workspace")
    sandbox_starts_per_s: float = Field(
        0.0,
        ge=0,
        description="sandbox starts per second of this process, workspaces and graders "
        "together (0: unlimited); a fleet's starts held to what the host sustains",
    )
    memory_mb: int = Field(1024, ge=64, description="memory of the workspace sandbox")
    fork: Literal["auto", "reflink", "hardlink", "copy"] = Field(
        "auto", description="how an episode's workspace forks the prepared one"
    )
    workspace_dir: str | None = Field(None, description="where workspaces live (default /tmp)")
    max_output_chars: int = Field(3000, ge=200, description="a tool's output shown")
    system_prompt: str | None = None
    fewshot: Literal["messages", "none"] = Field(
        "none", description="a worked episode (view, edit, DONE) as earlier turns"
    )
    tool_parser: str = "hermes"


class RepoEnv(ToolEnvironment):
    """Fix a bug in a repository with shell/view/edit tools; graded by hidden tests."""

    name = "repo"
    Options = RepoOptions
    tool_types: ClassVar = (ShellTool, ViewTool, EditTool)

    _prepared: ClassVar[dict[str, Any]] = {}  # task -> PreparedWorkspace, shared by forks

    config: RepoOptions

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.grader = RepoGrader.from_options(self.config)
        self.workspace: Workspace | None = None

    def make_tools(self) -> list[Any]:
        self.tool_parser = self.config.tool_parser
        self.handle = WorkspaceHandle(
            limits={
                "memory_mb": self.config.memory_mb,
                "cpu_s": self.config.command_timeout_s,
                "max_starts_per_s": self.config.sandbox_starts_per_s,
            },
            timeout_s=self.config.command_timeout_s,
            max_output_chars=self.config.max_output_chars,
        )
        return [ShellTool(self.handle), ViewTool(self.handle), EditTool(self.handle)]

    def make_verifier(self) -> Any:
        return GradedInReward(
            "repo grades the workspace's diff in reward(), not through a verifier"
        )

    def system_prompt(self) -> str:
        return self.config.system_prompt or INSTRUCTIONS

    def user_message(self, task: dict[str, Any]) -> str:
        listing = "\n".join(sorted(task["files"]))
        return f"{task['prompt']}\n\nFiles in /repo:\n{listing}"

    async def reset(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        messages = await super().reset(task)
        self._drop_workspace()
        root = workspace_root(self.config.workspace_dir)
        base = prepared_for(self._prepared, task, root, sandbox_uid=65534)
        self.workspace = base.fork(self.config.fork)
        self.handle.host_path = self.workspace.path
        if self.config.fewshot == "none":
            return messages
        system, user = messages
        turns: list[dict[str, Any]] = [{"role": "user", "content": _EXAMPLE_PROMPT}]
        for name, arguments, output in FEWSHOT:
            turns += [
                {"role": "assistant", "content": tool_call_text(name, arguments)},
                {"role": "tool", "name": name, "content": output},
            ]
        turns.append({"role": "assistant", "content": "DONE"})
        return [system, *turns, user]

    async def step(self, turn: Any) -> StepResult:
        if self.task is None or self.ctx is None:
            raise EnvError(f"{type(self).__name__}.step called before reset")
        if not prepare_calls(turn.text, self.tools, parser=self.tool_parser).attempted:
            return StepResult(done=True, info={"finished": True})
        return await super().step(turn)

    def diff(self) -> str:
        """The workspace's changes to the task's repository, as a unified diff."""
        if self.task is None or self.workspace is None:
            return ""
        current, _ = read_tree(self.workspace.path)
        return make_diff(self.task["files"], current)

    async def reward(self, trajectory: Any) -> tuple[float, dict[str, Any]] | None:
        """Grade the workspace's diff (also when the turn limit ended the episode)."""
        if self.task is None:
            return None
        diff = self.diff()
        reward, info = await self.grade(self.task, diff)
        return reward, {**info, "diff": diff, "fork": getattr(self.workspace, "mode", None)}

    async def grade(self, task: dict[str, Any], answer: str | None) -> tuple[float, dict[str, Any]]:
        """(reward, info) of the diff ``answer`` on ``task``: what training gives it."""
        if self.ctx is not None:
            return await self.grader.grade(
                await self._grading_sandbox(self.ctx, task), task, answer
            )
        async with ToolContext() as ctx:
            return await self.grader.grade(await self._grading_sandbox(ctx, task), task, answer)

    async def _grading_sandbox(self, ctx: ToolContext, task: dict[str, Any]) -> Any:
        limits = self.grader.sandbox_limits(tmp_mb=max(64, 4 * repo_size_mb(task)))
        limits["max_starts_per_s"] = self.config.sandbox_starts_per_s
        pace = await shared_pace(ctx, limits)  # the workspaces' bucket: one rate in all

        async def open_sandbox(stack: AsyncExitStack) -> Any:
            from agentrl.sandbox import create_sandbox

            sandbox = create_sandbox(backend="auto", pace=pace, **limits)
            stack.push_async_callback(sandbox.close)
            return sandbox

        return await ctx.run_resource("repo.grader:" + repr(sorted(limits.items())), open_sandbox)

    def _drop_workspace(self) -> None:
        if self.workspace is not None:
            self.workspace.remove()
            self.workspace = None

    async def close(self) -> None:
        await super().close()  # the workspace sandbox first: it binds the directory
        self._drop_workspace()

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
        if self.config.source == "file":
            assert self.config.dataset_path is not None
            yield from load_repo_tasks(self.config.dataset_path)
        else:
            yield from generated_tasks(split, seed, self.config.size)
