"""The environment of the viewer's fixture run: search_qa on the real index with a scripted
first move (the tiny random model cannot write one) and a scripted answer in some episodes
(so rewards differ within groups and across steps) or a second search in others (their
last turn is a tool call, not an answer cut at the token limit), a fresh task per group as in a real run,
one malformed tool call (a parse error), one call to a tool that raises, and one episode
whose environment fails (an infra_error). Held-out tasks (the ``eval`` split) are scored
the same way, so each evaluation has its own results per task.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from agentrl.envs.base import AssistantTurn, StepResult
from agentrl.envs.search_qa import SearchQAEnv, answer_text, call_text
from agentrl.errors import EnvError
from agentrl.tools.base import Tool, ToolContext, ToolOutput
from tests.envs.scripted_search import ScriptedSearchQAEnv

_RESETS = itertools.count()
_EVAL_RESETS = itertools.count()
MALFORMED_EPISODE = 1  # the second episode started writes a tool call that does not parse
RAISING_EPISODE = 2  # the third calls `lookup`, which raises
FAILING_EPISODE = 5  # the sixth episode started loses its environment
BAD_CALL = '<tool_call>\n{"name": "search", "arguments": {"query": </tool_call>'


class LookupArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str


class LookupTool(Tool):
    """A tool with a bug: every call raises (the call's error is what the view must show)."""

    name: ClassVar[str] = "lookup"
    description: ClassVar[str] = "Look a key up in the fixture's table."
    Args: ClassVar[type[BaseModel]] = LookupArgs

    async def call(self, args: BaseModel, ctx: ToolContext) -> ToolOutput:
        table: dict[str, str] = {}
        return ToolOutput(table[args.key])  # type: ignore[attr-defined]  # KeyError


class ViewFixtureEnv(ScriptedSearchQAEnv):
    name = "view_fixture_search_qa"

    def make_tools(self) -> list[Any]:
        return [*super().make_tools(), LookupTool()]

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
        if split == "eval":  # two held-out tasks, the same at every evaluation
            yield from itertools.islice(super().tasks(split, seed), 2)
        else:
            yield from super().tasks(split, seed)

    async def reset(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        held_out = task.get("split") == "eval"
        self.episode_no = -1 - next(_EVAL_RESETS) if held_out else next(_RESETS)
        if self.episode_no == FAILING_EPISODE:
            raise EnvError("search index unavailable (the fixture's injected failure)")
        return await super().reset(task)

    def answers(self) -> bool:
        """Whether this episode's last turn is scripted to give the right answer."""
        return self.episode_no % 3 == 0 if self.episode_no >= 0 else self.episode_no % 2 == 0

    async def step(self, turn: AssistantTurn) -> StepResult:
        self.turn += 1
        assert self.task is not None
        if self.turn == 1:  # the scripted search, as a Hermes tool call (or a broken one)
            call = call_text(self.task["question"], "tool_call")
            if self.episode_no == MALFORMED_EPISODE:
                call = BAD_CALL
            elif self.episode_no == RAISING_EPISODE:
                call = '<tool_call>\n{"name": "lookup", "arguments": {"key": "x"}}\n</tool_call>'
            turn = AssistantTurn(call, turn.token_ids, turn.finish_reason)
        elif self.answers():
            text = answer_text(self.task["answer"], "tool_call")
            turn = AssistantTurn(text, turn.token_ids, "stop")
        elif self.episode_no % 3 == 1:  # searches again: ends at max_turns, not cut short
            turn = AssistantTurn(call_text(self.task["question"], "tool_call"), turn.token_ids)
        return await SearchQAEnv.step(self, turn)
