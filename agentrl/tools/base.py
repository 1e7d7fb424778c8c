"""The tool contract: a name, a description, a pydantic argument model and an async call.

A tool's argument model becomes the JSON schema in the chat template's tool list. Tools
that need per-episode state (the python tool's sandbox session) keep it in the
:class:`ToolContext` the episode passes to every call; the context closes it when the
episode ends, on every exit path. Run-wide state (the sandbox those sessions come from)
goes in the run's scope through :meth:`ToolContext.run_resource`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel

from agentrl.resources import Factory, ResourceScope, current_run_scope

T = TypeVar("T")


@dataclass
class ToolOutput:
    """What a tool returns to the agent."""

    text: str
    data: Any = None  # optional structured result (not shown to the model)
    infra_error: bool = (
        False  # the platform failed, not the agent (docs/architecture.md, "Failures")
    )
    metadata: dict[str, Any] = field(default_factory=dict)
    # the call ran and failed (an exception in the code it ran, a timeout, a non-zero exit):
    # a short reason the trace records as the call's error (the text still says it all)
    error: str | None = None


@dataclass
class ToolCall:
    """A call parsed out of model text, before validation against the tool's Args."""

    name: str
    arguments: dict[str, Any]
    raw: str = ""  # the text the call was parsed from


class ToolContext(ResourceScope):
    """Per-episode resources shared by the episode's tool calls, closed at episode end.

    :meth:`run_resource` reaches the resources of the whole run (e.g. the python tool's
    sandbox): the entry point's run scope when one is active, else this episode's own
    scope, so a resource never outlives the scope that opened it."""

    def __init__(self) -> None:
        super().__init__("episode")

    async def run_resource(self, key: str, factory: Factory[T]) -> T:
        scope = current_run_scope() or self
        return await scope.get_or_create(key, factory)

    async def __aenter__(self) -> ToolContext:
        return self


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
