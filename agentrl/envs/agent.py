"""``env.name: agent`` -- train an agent program that talks to an OpenAI-compatible API.

    env:
      name: agent
      options:
        entrypoint: examples/calculator_agent.py:run   # async def run(client, task) -> float | dict
        # or: command: ["node", "agent.js"]            # any language; see below
        task_env: {name: code_math, options: {generators: [basic_arithmetic]}}
        # or: tasks: data/tasks.jsonl                  # {question, answer} rows, or a list

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

This class holds the options, tasks and scoring; it declares ``driven_from_outside``, and
the run assembly runs its episodes with the gateway's workflow (:mod:`agentrl.gateway.workflow`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from agentrl.envs.base import AssistantTurn, Environment, EnvOptions, Message, StepResult
from agentrl.envs.registry import make_env
from agentrl.errors import ConfigError, EnvError, PluginError
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
    # gateway
    max_n: int = Field(4, ge=1)  # largest n a request may ask for
    # any model name the program asks for (gpt-4o-mini ...) reaches the policy and is
    # recorded in the trace; true answers names other than agentrl / model.name with 404
    strict_model: bool = False
    tool_parser: str = "hermes"  # how tool calls are read from model text
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)  # 0 = a free port

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


class AgentEnv(Environment):
    """An agent program (a Python entrypoint or any command) behind the gateway."""

    name = "agent"
    Options = AgentOptions
    driven_from_outside = True  # the episode is the program; the run layer wires the gateway

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.config: AgentOptions
        self._task_env: Environment | None = None
        if self.config.task_env is not None:
            self._task_env = make_env(self.config.task_env.name, **self.config.task_env.options)
        self.verifier = self._make_verifier()

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

    async def reset(self, task: dict[str, Any]) -> list[Message]:
        raise EnvError(self._driven)

    async def step(self, turn: AssistantTurn) -> StepResult:
        raise EnvError(self._driven)

    _driven: ClassVar[str] = (
        "the agent environment has no reset/step: its program drives the episode through "
        "the gateway (agentrl.gateway.workflow), which the run assembly picks for env.name=agent"
    )
