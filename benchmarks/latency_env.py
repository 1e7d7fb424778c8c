"""A workload with tool latency for benchmarks: every assistant turn waits `delay_s` (a
stand-in for a remote search service) before its observation comes back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio

from agentrl.envs.base import AssistantTurn, Environment, StepResult


class LatencyEnv(Environment):
    name = "latency"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.delay_s = float(options.get("delay_s", 0.2))
        self.turns = int(options.get("turns", 2))
        self._turn = 0
        self._first: int | None = None

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
        for i in range(100_000):
            yield {"id": f"{split}-{seed}-{i}", "question": f"Look something up ({i})."}

    async def reset(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "user", "content": task["question"]}]

    async def step(self, turn: AssistantTurn) -> StepResult:
        self._turn += 1
        if self._first is None and turn.token_ids:
            self._first = turn.token_ids[0]
        if self._turn < self.turns:
            await anyio.sleep(self.delay_s)  # the remote tool
            return StepResult(observations=[{"role": "user", "content": "result: 42"}])
        even = self._first is not None and self._first % 2 == 0
        return StepResult(outcome=1.0 if even else 0.0, done=True)
