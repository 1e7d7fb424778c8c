"""ToolEnvironment's contract with tools that fail: a remote service that is down is
flagged as an infrastructure failure in the record, never raised from step()."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

from agentrl.envs import AssistantTurn, ExactMatchVerifier, ToolEnvironment, Verifier
from agentrl.errors import EnvError, ToolError
from agentrl.tools import Tool, ToolContext, ToolOutput


class LookupArgs(BaseModel):
    key: str


class RemoteLookup(Tool):
    """Stands in for a remote service (the one thing a fake is allowed for)."""

    name: ClassVar[str] = "lookup"
    description: ClassVar[str] = "Look a key up in a remote store."
    Args: ClassVar[type[BaseModel]] = LookupArgs
    down = False

    async def call(self, args: BaseModel, ctx: ToolContext) -> ToolOutput:
        if self.down:
            raise ToolError("connection refused by lookup.example:443")
        opened = await ctx.get_or_create("opened", _opened)
        opened.append(args.key)  # type: ignore[attr-defined]
        return ToolOutput(f"value of {args.key}: 42")  # type: ignore[attr-defined]


async def _opened(stack: Any) -> list[str]:
    return []


class LookupEnv(ToolEnvironment):
    """Answer with the looked-up value."""

    tool_types: ClassVar = (RemoteLookup,)

    def make_tools(self) -> list[Tool]:
        tool = RemoteLookup()
        tool.down = bool(self.options.get("down"))
        return [tool]

    def make_verifier(self) -> Verifier:
        return ExactMatchVerifier()


def call(key: str) -> str:
    return (
        "<tool_call>" + json.dumps({"name": "lookup", "arguments": {"key": key}}) + "</tool_call>"
    )


@pytest.mark.anyio
async def test_service_down_is_flagged_not_raised() -> None:
    env = LookupEnv(down=True)
    await env.reset({"id": "t", "question": "value of a?", "answer": "42"})
    result = await env.step(AssistantTurn(call("a"), []))
    assert not result.done
    record = result.info["tool_calls"][0]
    assert record.infra_error and "unavailable" in result.observations[0]["content"]
    await env.close()


@pytest.mark.anyio
async def test_calls_bad_calls_and_context_lifecycle() -> None:
    env = LookupEnv()
    with pytest.raises(EnvError, match="before reset"):
        await env.step(AssistantTurn("hi", []))
    await env.reset({"id": "t", "question": "value of a?", "answer": "42"})
    first_ctx = env.ctx
    result = await env.step(
        AssistantTurn(call("a") + "\n" + call("b") + "\n<tool_call>{oops</tool_call>", [])
    )
    assert [m["content"] for m in result.observations[:2]] == ["value of a: 42", "value of b: 42"]
    assert result.observations[2]["content"].startswith("error: invalid JSON")
    assert len(result.info["parse_errors"]) == 1 and not result.done
    unknown = await env.step(
        AssistantTurn('<tool_call>{"name": "lookpu", "arguments": {}}</tool_call>', [])
    )
    assert "did you mean 'lookup'" in unknown.observations[0]["content"]
    await env.reset({"id": "t2", "question": "again", "answer": "42"})  # a new episode
    assert env.ctx is not first_ctx
    final = await env.step(AssistantTurn("Answer: 42", []))
    assert final.done and final.outcome == 1.0 and await env.reward(None) == (1.0, final.info)
    await env.close()
    assert env.ctx is None
