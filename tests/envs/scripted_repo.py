"""repo with scripted tool calls, for runs on a tiny random model that cannot call tools:
turn 1 views the buggy file and turn 2 edits it through the real tools, in the real
workspace and sandbox. The edit applies the reference fix or a wrong one depending on the
parity of the model's first sampled token, so a group's graded rewards differ; later turns
are the model's own (a reply without a tool call ends the episode)."""

from __future__ import annotations

import json
from typing import Any

from agentrl.envs.base import AssistantTurn, StepResult
from agentrl.envs.coding.repo_diff import apply_diff, parse_diff
from agentrl.envs.repo import RepoEnv


def _call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class ScriptedRepoEnv(RepoEnv):
    name = "scripted_repo"

    async def reset(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        self.turn = 0
        return await super().reset(task)

    async def step(self, turn: AssistantTurn) -> StepResult:
        self.turn += 1
        assert self.task is not None
        path = parse_diff(self.task["reference_fix"])[0].path
        if self.turn == 1:
            turn = AssistantTurn(_call("view", path=path), turn.token_ids)
        elif self.turn == 2:
            fixed = apply_diff(self.task["files"], self.task["reference_fix"]).files[path]
            if turn.token_ids and turn.token_ids[0] % 2:  # the model's own choice, in effect
                fixed = self.task["files"][path] + "\n# touched, still buggy\n"
            turn = AssistantTurn(_call("edit", path=path, old="", new=fixed), turn.token_ids)
        return await super().step(turn)
