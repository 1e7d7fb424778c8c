"""search_qa with a scripted first move, for runs on a tiny random model that cannot
write a search itself: its first ``scripted_searches`` turns search for the question
(whatever the model wrote), through the real tool, index or HTTP service; later turns
are the model's own and are scored by the real verifier."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from agentrl.envs.base import AssistantTurn, StepResult
from agentrl.envs.search_qa import SearchQAEnv, SearchQAOptions


class ScriptedSearchOptions(SearchQAOptions):
    scripted_searches: int = Field(1, ge=0)


class ScriptedSearchQAEnv(SearchQAEnv):
    name = "scripted_search_qa"
    Options = ScriptedSearchOptions

    async def reset(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        self.turn = 0
        return await super().reset(task)

    async def step(self, turn: AssistantTurn) -> StepResult:
        self.turn += 1
        if self.turn <= self.config.scripted_searches:
            assert self.task is not None
            turn = AssistantTurn(f"<search>{self.task['question']}</search>", turn.token_ids)
        return await super().step(turn)
