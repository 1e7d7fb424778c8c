"""The step-environment contract (docs/architecture.md).

Environments come in two protocols sharing :class:`EnvBase` (options, tasks, spawn,
close): a step environment (:class:`Environment`: ``reset`` / ``step`` / ``reward``) is
driven by the rollout's episode runner; an agent program
(:class:`agentrl.envs.program.AgentProgram`: ``program`` / ``score``) drives its episode
itself through an OpenAI-compatible endpoint that the run layer provides (the gateway).

An :class:`Environment` instance holds the state of one episode. The rollout gets a
configured instance from :func:`agentrl.envs.make_env`, reads tasks from it, and calls
:meth:`Environment.spawn` for a fresh instance per episode (heavy shared resources, such
as a search index, belong in class-level caches, not per-episode state).

:class:`ToolEnvironment` is the standard kind: tools + tool-call parsing + a verifier.
A turn with tool calls gets the tools' results back as ``tool`` messages; a turn without
any is the final answer and is scored by the verifier. The turn limit is the rollout's.

Failures (docs/architecture.md, "Failures"): anything an environment raises in ``reset``/``step`` is an
infrastructure failure of that episode; :func:`safe_reset` / :func:`safe_step` turn it
into :class:`agentrl.errors.EnvError` (the rollout does the same). A tool timeout or a
malformed call is an observation for the agent, never an exception.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

import anyio
from pydantic import BaseModel, ConfigDict, ValidationError

from agentrl._suggest import suggest
from agentrl.errors import ConfigError, EnvError, InfraError
from agentrl.tools import prepare_calls, run_tool_calls
from agentrl.tools.base import ToolContext

T = TypeVar("T")

if TYPE_CHECKING:
    from agentrl.envs.verifiers import Verifier
    from agentrl.tools.base import Tool

Message = dict[str, Any]  # {"role": ..., "content": ..., optional "tool_calls"/"name"}


@dataclass
class AssistantTurn:
    """What the model said in one turn (text decoded from the sampled tokens)."""

    text: str
    token_ids: list[int]
    finish_reason: str = "stop"


@dataclass
class StepResult:
    """The environment's answer to one assistant turn.

    Two reward fields, never inferred from each other (DESIGN.md §14): ``step_reward`` is
    this step's own reward (trained with weight ``reward.step_weight``), ``outcome`` the
    episode's outcome, given on the step that ends it (``done=True``). A game's return is
    the outcome plus the step rewards before it: report each reward once."""

    observations: list[Message] = field(default_factory=list)  # e.g. role "tool" messages
    step_reward: float | None = None  # None: this step is not scored
    outcome: float | None = None  # only with done=True; None: the episode has no outcome
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)  # tool_calls, parse_errors, ...

    def __post_init__(self) -> None:
        if self.outcome is not None and not self.done:
            raise ValueError(
                f"StepResult(outcome={self.outcome}) on a step that does not end the episode: "
                "an outcome comes with done=True; report this step's own reward as step_reward"
            )

    @property
    def reward(self) -> float | None:
        """Removed: the old single field mixed the outcome and step rewards."""
        raise AttributeError(_REWARD_SPLIT)

    @reward.setter
    def reward(self, value: float | None) -> None:
        raise AttributeError(_REWARD_SPLIT)


_REWARD_SPLIT = (
    "StepResult.reward was split in two: set step_reward= for this step's own reward and "
    "outcome= (with done=True) for the episode's outcome"
)


class EnvOptions(BaseModel):
    """Base of an environment's options model: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class EnvBase(abc.ABC):  # noqa: B024 (shared part; each protocol declares its abstract methods)
    """What both environment protocols share: options, tasks, tool listing, spawn, close.

    Set ``Options`` to a :class:`EnvOptions` subclass to validate ``**options``; the
    parsed model is then ``self.config``. Subclass :class:`Environment` or
    :class:`agentrl.envs.program.AgentProgram`, not this class.
    """

    name: ClassVar[str] = ""
    Options: ClassVar[type[EnvOptions] | None] = None

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.config: Any = parse_options(type(self), options) if self.Options else None

    def spawn(self) -> Self:
        """A fresh instance for a new episode, configured like this one."""
        return type(self)(**self.options)

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
        """Yield tasks (dicts with at least an 'id'); deterministic for a given seed."""
        raise NotImplementedError(f"{type(self).__name__} does not provide tasks")

    def tool_schemas(self) -> list[dict[str, Any]]:
        """Function schemas rendered into the chat template (empty for tool-less envs)."""
        return []

    def stop_strings(self) -> tuple[str, ...]:
        """Strings that end an assistant turn besides its end-of-turn token (kept in the
        text), e.g. ``</search>`` so the model waits for real results."""
        return ()

    @classmethod
    def tool_names(cls) -> list[str]:
        """Names of the tools this environment offers (for `agentrl envs list`)."""
        return []

    async def close(self) -> None:  # noqa: B027 (optional hook, not abstract)
        """Release per-episode resources (sandbox sessions ...)."""


class Environment(EnvBase):
    """A step environment: one episode's state. Subclass and implement `reset`, `step`
    and `tasks`; the rollout's episode runner drives it turn by turn."""

    @abc.abstractmethod
    async def reset(self, task: dict[str, Any]) -> list[Message]:
        """Start an episode: return the initial messages (system + user)."""

    @abc.abstractmethod
    async def step(self, turn: AssistantTurn) -> StepResult:
        """React to one assistant turn."""

    async def reward(self, trajectory: Any) -> tuple[float, dict[str, Any]] | None:
        """Optional final scoring: the episode's outcome and its info, replacing the last
        step's ``StepResult.outcome``; None keeps that (0.0 when no step gave one). Step
        rewards are never part of it."""
        return None

    def state_key(self) -> Hashable | None:
        """Optional: a hashable key of the state the agent is about to act from, read
        before each assistant turn. Turns of a group's episodes with equal keys acted from
        the same state (GiGPO's anchor states); None: not given. Stored as ``repr()``
        unless it is a string."""
        return None


def parse_options(env_cls: type[EnvBase], options: dict[str, Any]) -> Any:
    """Validate ``options`` with ``env_cls.Options``; errors name the option and the fix."""
    assert env_cls.Options is not None
    known = list(env_cls.Options.model_fields)
    label = env_cls.name or env_cls.__name__
    try:
        return env_cls.Options(**options)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"])
            if not key:  # a check across options (a model validator): its message says which
                problems.append(f"options: {err['msg']} (got {err.get('input')!r})")
            elif err["type"] == "extra_forbidden":
                problems.append(
                    f"unknown option {key!r}{suggest(key, known)}; known options: "
                    + ", ".join(known)
                )
            else:
                problems.append(f"option {key!r}: {err['msg']} (got {err.get('input')!r})")
        raise ConfigError(f"environment {label!r}: " + "; ".join(problems)) from None


async def env_call(env: Environment, what: str, fn: Callable[[], Awaitable[T]]) -> T:
    """``await fn()`` (a call of `env`'s `what`); anything but an :class:`InfraError` it
    raises becomes an :class:`EnvError` (the environment's bug is the platform's failure)."""
    try:
        return await fn()
    except InfraError:
        raise
    except Exception as e:
        raise EnvError(f"environment {type(env).__name__}.{what} raised: {e!r}") from e


async def safe_reset(env: Environment, task: dict[str, Any]) -> list[Message]:
    """``env.reset(task)``; an exception becomes :class:`EnvError` (infra failure)."""
    return await env_call(env, "reset", lambda: env.reset(task))


async def safe_step(env: Environment, turn: AssistantTurn) -> StepResult:
    """``env.step(turn)``; an exception becomes :class:`EnvError` (infra failure)."""
    return await env_call(env, "step", lambda: env.step(turn))


class ToolEnvironment(Environment):
    """Tools + tool-call parsing + a verifier.

    Subclasses implement :meth:`make_tools`, :meth:`make_verifier` and :meth:`tasks`, and
    usually override :meth:`system_prompt`; :meth:`user_message` defaults to
    ``task["question"]``. Declare ``tool_types`` (tool classes) so listings can name the
    tools without building them.
    """

    tool_types: ClassVar[Sequence[type[Tool]]] = ()
    tool_parser: str = "hermes"  # a name from agentrl.tools.parser_names()

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.tools: list[Tool] = self.make_tools()
        self.verifier: Verifier = self.make_verifier()
        self.task: dict[str, Any] | None = None
        self.ctx: ToolContext | None = None
        self.final: tuple[float, dict[str, Any]] | None = None

    # --- what subclasses provide -----------------------------------------------------

    def make_tools(self) -> list[Tool]:
        return []

    @abc.abstractmethod
    def make_verifier(self) -> Verifier: ...

    def system_prompt(self) -> str:
        return "You are a helpful assistant. Use the tools when they help."

    def user_message(self, task: dict[str, Any]) -> str:
        return str(task["question"])

    @classmethod
    def tool_names(cls) -> list[str]:
        return [t.name for t in cls.tool_types]

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.tools]

    # --- the episode -----------------------------------------------------------------

    async def reset(self, task: dict[str, Any]) -> list[Message]:
        if self.ctx is not None:
            await self.ctx.aclose()
        self.task, self.ctx, self.final = task, ToolContext(), None
        return [
            {"role": "system", "content": self.system_prompt()},
            {"role": "user", "content": self.user_message(task)},
        ]

    async def step(self, turn: AssistantTurn) -> StepResult:
        if self.task is None or self.ctx is None:
            raise EnvError(f"{type(self).__name__}.step called before reset")
        prepared = prepare_calls(turn.text, self.tools, parser=self.tool_parser)
        if not prepared.attempted:  # no call at all, not even a malformed one: the answer
            # scorers may parse expressions (sympy): keep them off the event loop
            reward, info = await anyio.to_thread.run_sync(self.verifier.score, turn.text, self.task)
            self.final = (float(reward), info)
            return StepResult(outcome=float(reward), done=True, info=info)
        results = await run_tool_calls(prepared, self.ctx)
        return StepResult(
            observations=[r.message for r in results],
            done=False,
            info={"tool_calls": [r.record for r in results], "parse_errors": prepared.errors},
        )

    async def reward(self, trajectory: Any) -> tuple[float, dict[str, Any]] | None:
        """The verifier's score of the final answer (None if the episode had none)."""
        return self.final

    async def close(self) -> None:
        if self.ctx is not None:
            ctx, self.ctx = self.ctx, None
            await ctx.aclose()
