"""``env.name: agent`` -- train an agent program that talks to an OpenAI-compatible API.

    env:
      name: agent
      options:
        entrypoint: examples/calculator_agent.py:run   # async def run(client, task) -> float | dict
        # or: command: ["node", "agent.js"]            # any language; see below
        task_env: {name: code_math, options: {generators: [basic_arithmetic]}}
        # or: tasks: data/tasks.jsonl                  # {question, answer} rows, or a list
        # or: task_env: {name: repo}, sandbox: bwrap   # a coding harness on a repository

With ``task_env: {name: repo}`` each episode gets its own fork of the task's repository,
bound at ``/repo`` in the bubblewrap sandbox (the program's working directory); the
command's ``{prompt}`` is the task's issue text and ``{workspace}`` the folder. The
reward is the repo environment's: the workspace's diff graded by hidden tests. The program
gets no task on stdin (it holds the hidden tests) and what it prints is kept, not parsed.
Coding harnesses (mini-swe-agent, OpenCode, Claude Code, Codex) run this way unchanged
(docs/gateway.md, "Harnesses").

The run's gateway (:mod:`agentrl.gateway`) serves each episode on its own base URL and
key and records every call token for token. An ``entrypoint`` gets an
``openai.AsyncOpenAI`` pointed at it and the task; a ``command`` gets ``OPENAI_BASE_URL``,
``OPENAI_API_KEY`` and ``OPENAI_MODEL`` in its environment and the task as JSON on stdin,
and prints its result as JSON on the last line of stdout.

The result is the reward (a number, or ``{"reward": ..., ...info}``), unless a verifier
scores the episode: ``verifier`` (``math``, ``exact_match``, ``reasoning_gym`` or
``module:Class``), or the ``task_env``'s own. It scores ``result["answer"]`` (or a string
result), else the model's last reply. A program that crashes, prints no result or runs
past ``rollout.episode_timeout_s`` is an infrastructure failure of its episode only.

An :class:`~agentrl.envs.program.AgentProgram`: the run layer opens the episode's gateway
session and calls :meth:`AgentEnv.program` with it (:mod:`agentrl.gateway.workflow`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import Field, model_validator

from agentrl.envs.agent_programs import (
    ProgramFailed,
    Workspace,
    load_entrypoint,
    run_command,
    run_entrypoint,
)
from agentrl.envs.base import EnvBase, EnvOptions
from agentrl.envs.coding.repo_diff import make_diff, read_tree
from agentrl.envs.coding.workspace import prepared_for, workspace_root
from agentrl.envs.program import AgentProgram, ModelEndpoint
from agentrl.envs.registry import make_env
from agentrl.envs.repo import RepoEnv
from agentrl.errors import ConfigError, EnvError, InfraError, PluginError
from agentrl.registry import load_object


class TaskEnv(EnvOptions):
    name: str
    options: dict[str, Any] = Field(default_factory=dict)


class AgentOptions(EnvOptions):
    entrypoint: str | None = None  # "package.module:run" or "file.py:run"
    command: list[str] | None = None  # argv; "{python}" is this interpreter
    tasks: str | list[dict[str, Any]] | None = None  # .jsonl/.parquet file or inline rows
    task_env: TaskEnv | None = None  # tasks (and the verifier) of another environment
    verifier: str | None = None  # math | exact_match | reasoning_gym | module:Class
    # command agents: "process" = own process group, scrubbed environment, private HOME and
    # TMPDIR, output cap, killed with its children on every exit path; "bwrap" adds
    # bubblewrap namespaces (read-only host, private /tmp and /proc; network shared so the
    # gateway is reachable)
    sandbox: Literal["process", "bwrap"] = "process"
    env: dict[str, str] = Field(default_factory=dict)  # extra environment of a command
    cwd: str | None = None  # working directory of a command (default: the current one)
    memory_mb: int | None = Field(None, ge=16)  # address-space limit of a command
    max_output_bytes: int = Field(1 << 20, ge=1024)  # stdout/stderr kept per stream

    @model_validator(mode="after")
    def _one_program(self) -> AgentOptions:
        if (self.entrypoint is None) == (self.command is None):
            raise ValueError(
                "give exactly one of entrypoint ('module:function', an async def "
                "run(client, task)) or command (an argv list)"
            )
        if self.command is not None and not self.command:
            raise ValueError("command must name a program (got an empty list)")
        if self.tasks is None and self.task_env is None:
            raise ValueError("give tasks (a .jsonl/.parquet file or a list) or task_env")
        return self


VERIFIERS = {
    "math": "agentrl.envs.verifiers:MathVerifier",
    "exact_match": "agentrl.envs.verifiers:ExactMatchVerifier",
    "reasoning_gym": "agentrl.envs.verifiers:ReasoningGymVerifier",
}


class AgentEnv(AgentProgram):
    """An agent program (a Python entrypoint or any command) behind the gateway."""

    name = "agent"
    Options = AgentOptions

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.config: AgentOptions
        self._task_env: EnvBase | None = None
        if self.config.task_env is not None:
            self._task_env = make_env(self.config.task_env.name, **self.config.task_env.options)
        self._repo = isinstance(self._task_env, RepoEnv)
        self._prepared: dict[str, Any] = {}  # task -> its repository written once
        if self._repo:
            self._check_workspace_options()
        # a repository episode is graded by its diff (program()), never by a verifier
        self.verifier = None if self._repo else self._make_verifier()
        # a bad entrypoint fails when the environment is built, before any episode
        self._entrypoint = (
            load_entrypoint(self.config.entrypoint) if self.config.entrypoint is not None else None
        )

    def _check_workspace_options(self) -> None:
        if self.config.command is None:
            raise ConfigError(
                "env.options.task_env=repo runs a command in the episode's repository: give "
                "env.options.command (an entrypoint has no workspace)"
            )
        if self.config.sandbox != "bwrap":
            raise ConfigError(
                "env.options.task_env=repo binds each episode's repository at /repo (where "
                "the task's prompt says it is): set env.options.sandbox: bwrap"
            )
        if self.config.verifier is not None:
            raise ConfigError(
                "env.options.verifier: a repo task is graded by its diff and hidden tests; "
                "leave verifier unset"
            )

    def _make_verifier(self) -> Any:
        name = self.config.verifier
        if name is None:
            return getattr(self._task_env, "verifier", None)
        target = VERIFIERS.get(name, name)
        if ":" not in target:
            raise ConfigError(
                f"env.options.verifier={name!r}: use one of {', '.join(VERIFIERS)} or "
                "'package.module:Class'"
            )
        try:
            cls = load_object(target, "verifier")
        except PluginError as e:
            raise ConfigError(f"env.options.verifier={name!r}: {e}") from None
        return cls()

    @classmethod
    def tool_names(cls) -> list[str]:
        return []  # the program brings its own tools

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
        tasks = self.config.tasks
        if self._task_env is not None:
            yield from self._task_env.tasks(split=split, seed=seed)
        elif isinstance(tasks, str):
            from agentrl.envs.dataset import load_task_file

            yield from load_task_file(tasks)
        else:
            for i, row in enumerate(tasks or []):
                yield {**row, "id": str(row.get("id", f"task-{i}"))}

    @property
    def label(self) -> str:
        program = self.config.entrypoint or (self.config.command or ["?"])[0]
        return f"agent:{program}"

    async def program(self, endpoint: ModelEndpoint, task: dict[str, Any]) -> Any:
        """The entrypoint with a client on `endpoint`, or the command with it in its
        environment; the program's result."""
        if self._entrypoint is not None:
            return await run_entrypoint(self._entrypoint, endpoint.client(), task)
        if self._repo:
            return await self._repo_episode(endpoint, task)
        return await run_command(
            self.config, task, endpoint.base_url, endpoint.api_key, endpoint.model
        )

    async def _repo_episode(self, endpoint: ModelEndpoint, task: dict[str, Any]) -> Any:
        """The command in a fork of the task's repository; its diff graded by hidden tests."""
        assert isinstance(self._task_env, RepoEnv)
        root = workspace_root(self._task_env.config.workspace_dir)
        # the program runs as us (bubblewrap keeps our uid): the fork is handed to it
        base = prepared_for(self._prepared, task, root, sandbox_uid=os.geteuid())
        fork = base.fork(self._task_env.config.fork)
        failed: InfraError | None = None
        try:
            prompt = self._task_env.user_message(task)
            try:
                output = await run_command(
                    self.config,
                    task,
                    endpoint.base_url,
                    endpoint.api_key,
                    endpoint.model,
                    workspace=Workspace(host_path=fork.path, path="/repo", prompt=prompt),
                )
            except InfraError as e:  # graded all the same: the run layer decides (below)
                output, failed = "", e
            current, _ = read_tree(fork.path)
        finally:
            fork.remove()
        diff = make_diff(task["files"], current)
        reward, info = await self._task_env.grade(task, diff)
        result = {"reward": reward, **info, "diff": diff, "agent_output": output}
        if failed is not None:
            raise ProgramFailed(str(failed), result) from failed
        return result

    def score(self, result: Any, task: dict[str, Any], last_reply: str) -> tuple[float, dict]:
        """(reward, info) of an episode whose program returned `result`."""
        if self.verifier is not None:
            if isinstance(result, dict) and "answer" in result:
                answer = str(result["answer"])
            else:
                answer = result if isinstance(result, str) else last_reply
            reward, info = self.verifier.score(answer, task)
            info = dict(info)
            if isinstance(result, int | float | dict):
                info["agent_result"] = result
            return float(reward), info
        if isinstance(result, bool) or result is None:
            raise EnvError(
                f"the agent returned {result!r}: return a number or {{'reward': ...}} (or set "
                "env.options.verifier to score its answer)"
            )
        if isinstance(result, int | float):
            return float(result), {}
        if isinstance(result, dict) and isinstance(result.get("reward"), int | float):
            info = {k: v for k, v in result.items() if k != "reward"}
            return float(result["reward"]), info
        raise EnvError(
            f"the agent returned {type(result).__name__} {str(result)[:200]!r}: return a "
            "number or {'reward': ...} (or set env.options.verifier to score its answer)"
        )
