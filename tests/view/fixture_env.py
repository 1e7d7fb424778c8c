"""The environment of the viewer's fixture run: search_qa on the real index with a scripted
first move (the tiny random model cannot write one), the same two tasks every step, one
malformed tool call (a parse error) and one episode whose environment fails (an infra_error).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from agentrl.envs.base import AssistantTurn, StepResult
from agentrl.envs.search_qa import SearchQAEnv, call_text
from agentrl.errors import EnvError
from tests.envs.scripted_search import ScriptedSearchQAEnv

_RESETS = itertools.count()
MALFORMED_EPISODE = 1  # the second episode started writes a tool call that does not parse
FAILING_EPISODE = 5  # the sixth episode started loses its environment
BAD_CALL = '<tool_call>\n{"name": "search", "arguments": {"query": </tool_call>'


class ViewFixtureEnv(ScriptedSearchQAEnv):
    name = "view_fixture_search_qa"

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
        first_two = list(itertools.islice(super().tasks(split, seed), 2))
        while True:  # the same two tasks each step: step N vs step M has something to show
            yield from first_two

    async def reset(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        self.episode_no = next(_RESETS)
        if self.episode_no == FAILING_EPISODE:
            raise EnvError("search index unavailable (the fixture's injected failure)")
        return await super().reset(task)

    async def step(self, turn: AssistantTurn) -> StepResult:
        self.turn += 1
        if self.turn == 1:  # the scripted search, as a Hermes tool call (or a broken one)
            assert self.task is not None
            call = call_text(self.task["question"], "tool_call")
            text = BAD_CALL if self.episode_no == MALFORMED_EPISODE else call
            turn = AssistantTurn(text, turn.token_ids, turn.finish_reason)
        return await SearchQAEnv.step(self, turn)
