"""The environment contract (DESIGN.md §4).

An :class:`Environment` instance holds the state of one episode. The rollout gets a
configured instance from :func:`agentrl.envs.make_env`, reads tasks from it, and calls
:meth:`Environment.spawn` for a fresh instance per episode (heavy shared resources, such
as a search index, belong in class-level caches, not per-episode state).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

Message = dict[str, Any]  # {"role": ..., "content": ..., optional "tool_calls"/"name"}


@dataclass
class AssistantTurn:
    """What the model said in one turn (text decoded from the sampled tokens)."""

    text: str
    token_ids: list[int]
    finish_reason: str = "stop"


@dataclass
class StepResult:
    """The environment's answer to one assistant turn."""

    observations: list[Message] = field(default_factory=list)  # e.g. role "tool" messages
    reward: float | None = None  # final (or shaped) reward; None = not scored here
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)  # tool_calls, parse_errors, ...


class Environment(abc.ABC):
    """One episode's environment. Subclass and implement `reset`, `step` and `tasks`."""

    name: ClassVar[str] = ""

    def __init__(self, **options: Any) -> None:
        self.options = options

    def spawn(self) -> Environment:
        """A fresh instance for a new episode, configured like this one."""
        return type(self)(**self.options)

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
        """Yield tasks (dicts with at least an 'id'); deterministic for a given seed."""
        raise NotImplementedError(f"{type(self).__name__} does not provide tasks")

    def tool_schemas(self) -> list[dict[str, Any]]:
        """Function schemas rendered into the chat template (empty for tool-less envs)."""
        return []

    @abc.abstractmethod
    async def reset(self, task: dict[str, Any]) -> list[Message]:
        """Start an episode: return the initial messages (system + user)."""

    @abc.abstractmethod
    async def step(self, turn: AssistantTurn) -> StepResult:
        """React to one assistant turn."""

    async def reward(self, trajectory: Any) -> tuple[float, dict[str, Any]] | None:
        """Optional final scoring of a whole trajectory; None keeps the step rewards."""
        return None

    async def close(self) -> None:
        """Release per-episode resources (sandbox sessions ...)."""
