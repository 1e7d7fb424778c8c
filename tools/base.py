"""The tool contract: a name, a description, a pydantic argument model and an async call.

A tool's argument model becomes the JSON schema in the chat template's tool list. Tools
that need per-episode state (the python tool's sandbox session) keep it in the
:class:`ToolContext` the episode passes to every call; the context closes it when the
episode ends, on every exit path.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel


@dataclass
class ToolOutput:
    """What a tool returns to the agent."""

    text: str
    data: Any = None  # optional structured result (not shown to the model)
    infra_error: bool = False  # the platform failed, not the agent (DESIGN.md §6)
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class ToolCall:
    """A call parsed out of model text, before validation against the tool's Args."""

    name: str
    arguments: dict[str, Any]
    raw: str = ""  # the text the call was parsed from


class ToolContext:
    """Per-episode resources shared by the episode's tool calls, closed at episode end."""

    def __init__(self) -> None:
        self._stack = AsyncExitStack()
        self._resources: dict[str, Any] = {}

    async def get_or_create(
        self, key: str, factory: Callable[[AsyncExitStack], Awaitable[Any]]
    ) -> Any:
        """Return the resource under `key`, creating it with `factory(exit_stack)` once."""
        if key not in self._resources:
            self._resources[key] = await factory(self._stack)
        return self._resources[key]

    def discard(self, key: str) -> None:
        self._resources.pop(key, None)

    async def aclose(self) -> None:
        self._resources.clear()
        await self._stack.aclose()

    async def __aenter__(self) -> ToolContext:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class Tool(abc.ABC):
    """Subclass, set `name`, `description`, `Args`, and implement `call`."""

    name: ClassVar[str]
    description: ClassVar[str]
    Args: ClassVar[type[BaseModel]]
    timeout: float = 30.0  # seconds; exceeding it is an error observation, not a crash
    sequential: ClassVar[bool] = False  # calls in one turn run in order (stateful tools)

    def schema(self) -> dict[str, Any]:
        """OpenAI-style function schema, as chat templates expect in `tools=`."""
        params = self.Args.model_json_schema()
        params.pop("title", None)
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": params},
        }

    @abc.abstractmethod
    async def call(self, args: BaseModel, ctx: ToolContext) -> ToolOutput:
        """Run the tool. Raise only for platform failures; agent mistakes are output text."""
