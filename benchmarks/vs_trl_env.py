"""agentrl's side of benchmarks/vs_trl.py: one chat turn per reasoning-gym
``basic_arithmetic`` question, scored by the same function TRL's side uses.

Tasks come in a fixed order (index 0, 1, 2, ... of the seeded reasoning-gym dataset), so
step s trains tasks 2s and 2s + 1 on both sides."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from agentrl.envs.base import AssistantTurn, Environment, StepResult
from benchmarks.vs_trl import arithmetic_tasks, score


class ArithmeticEnv(Environment):
    name = "vs_trl_arithmetic"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.seed = int(options.get("seed", 0))
        self.size = int(options.get("size", 64))
        self._answer: str | None = None

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
        for i, t in enumerate(arithmetic_tasks(self.size, self.seed)):
            yield {"id": f"arith-{i}", **t}

    async def reset(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        self._answer = task["answer"]
        return [{"role": "user", "content": task["question"]}]

    async def step(self, turn: AssistantTurn) -> StepResult:
        assert self._answer is not None
        return StepResult(outcome=score(turn.text, self._answer), done=True)
