"""The state of an episode: its limits, the mutable state of a running one, and the
snapshot a branch forks from (the loop that advances it is :mod:`agentrl.rollout.episode`)."""

from __future__ import annotations

import copy
import math
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.envs.base import AssistantTurn, Environment, Message
from agentrl.rollout.settings import RolloutSettings
from agentrl.samplers.base import Generation
from agentrl.types import Segment, Trajectory, Turn


@dataclass(frozen=True)
class EpisodeLimits:
    """Per-episode limits (from :class:`~agentrl.rollout.settings.RolloutSettings`)."""

    max_turns: int = 4
    max_tool_calls: int = 8
    max_tokens: int = 1024  # response tokens (model + observation) after the prompt
    timeout_s: float = 300.0  # wall clock of one attempt
    infra_retries: int = 1
    context_length: int | None = None  # model context; None = unknown (not enforced)
    on_template_mismatch: Literal["error", "resample"] = "error"

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1 (got {self.max_turns})")
        if self.max_tool_calls < 0:
            raise ValueError(f"max_tool_calls must be >= 0 (got {self.max_tool_calls})")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 (got {self.max_tokens})")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0 (got {self.timeout_s})")
        if self.infra_retries < 0:
            raise ValueError(f"infra_retries must be >= 0 (got {self.infra_retries})")

    @classmethod
    def from_settings(
        cls, settings: RolloutSettings, context_length: int | None = None
    ) -> EpisodeLimits:
        """The limits ``rollout`` sets, with the model's context length."""
        return cls(
            max_turns=settings.max_turns,
            max_tool_calls=settings.max_tool_calls,
            max_tokens=settings.max_tokens,
            timeout_s=settings.episode_timeout_s,
            infra_retries=settings.infra_retries,
            context_length=context_length,
            on_template_mismatch=settings.on_template_mismatch,  # type: ignore[arg-type]
        )


@dataclass
class Snapshot:
    """An episode frozen right after an observation: the point a branch forks from."""

    segments: list[Segment]
    turns: list[Turn]
    messages: list[Message]
    steps: list[AssistantTurn]
    observations: list[list[Message]]
    num_tool_calls: int
    initial_entropy: float | None

    @property
    def position(self) -> int:
        """Token index in ``input_ids`` where a continuation from here starts."""
        return sum(len(s) for s in self.segments)


@dataclass
class EpisodeState:
    """Mutable state of one running episode."""

    task: dict[str, Any]
    env: Environment
    traj: Trajectory
    messages: list[Message]
    steps: list[AssistantTurn] = field(default_factory=list)  # replay log of env.step inputs
    observations: list[list[Message]] = field(default_factory=list)  # what env.step answered
    num_tool_calls: int = 0
    outcome: float | None = None  # StepResult.outcome of the step that ended the episode
    initial_entropy: float | None = None  # mean entropy of the first k tokens (nats)
    after_tool: bool = False  # the last segment is an observation that holds tool results
    seed: int | None = None

    def snapshot(self) -> Snapshot:
        return Snapshot(
            segments=list(self.traj.segments),  # Segment objects are shared, never mutated
            turns=copy.deepcopy(self.traj.turns),
            messages=list(self.messages),
            steps=list(self.steps),
            observations=list(self.observations),
            num_tool_calls=self.num_tool_calls,
            initial_entropy=self.initial_entropy,
        )

    @property
    def response_tokens(self) -> int:
        return self.traj.num_tokens - prompt_length(self.traj)


# A hook called after a turn that follows a tool result has been generated and before
# the environment sees it: (state, snapshot right after the tool result, generation).
BranchHook = Callable[[EpisodeState, Snapshot, Generation], Awaitable[None]]


def prompt_length(traj: Trajectory) -> int:
    return sum(len(s) for s in traj.segments if s.kind == "prompt")


def new_id() -> str:
    return uuid.uuid4().hex[:12]


def mean_entropy(entropies: Sequence[float] | None, k: int) -> float | None:
    """Mean per-token entropy (nats) of the first `k` generated tokens."""
    if not entropies:
        return None
    head = list(entropies[:k])
    return sum(head) / len(head)


def normalised(entropy: float | None, vocab_size: int) -> float | None:
    """Entropy divided by ln|V| (1.0 = uniform over the vocabulary)."""
    return None if entropy is None else entropy / math.log(vocab_size)
