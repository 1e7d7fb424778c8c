"""A tiny environment for orchestrator tests: reward 1 when the first sampled token id is even.

A randomly initialised model gets mixed rewards (about half), so GRPO has signal, and the
policy can measurably learn it in a few steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio

from agentrl.envs.base import AssistantTurn, Environment, StepResult


class ParityEnv(Environment):
    name = "parity"

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
        n = int(self.options.get("size", 1000))
        for i in range(n):
            yield {"id": f"{split}-{seed}-{i}", "question": f"Say something ({i})."}

    async def reset(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "user", "content": task["question"]}]

    async def step(self, turn: AssistantTurn) -> StepResult:
        even = bool(turn.token_ids) and turn.token_ids[0] % 2 == 0
        return StepResult(outcome=1.0 if even else 0.0, done=True, info={"extracted": str(even)})


class ConstantEnv(ParityEnv):
    """Every sample scores the same: dynamic sampling can never form a batch."""

    name = "constant"

    async def step(self, turn: AssistantTurn) -> StepResult:
        return StepResult(outcome=0.0, done=True, info={"extracted": "0"})


class HeldParityEnv(ParityEnv):
    """ParityEnv whose episodes for tasks at index >= ``options.hold_from`` never start.

    A synchronous run with ``batch_groups`` groups a step then trains and checkpoints
    exactly ``hold_from / batch_groups`` steps and waits: a test kills it at a known point
    (after that checkpoint) instead of at a random time.
    """

    name = "held_parity"

    async def reset(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        hold_from = self.options.get("hold_from")
        if hold_from is not None and int(task["id"].rsplit("-", 1)[1]) >= int(hold_from):
            await anyio.Event().wait()  # held until the process is killed
        return await super().reset(task)


class LaggingParityEnv(ParityEnv):
    """ParityEnv where every 4th task's episodes end only once the task ``options.lag``
    places later has started (or after ``options.max_wait_s``, for the last tasks of a
    run): more than a batch of groups apart, so a group is in flight while steps are
    trained and checkpointed, however fast or loaded the machine is."""

    name = "lagging_parity"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._started: dict[int, anyio.Event] = {}  # task index -> its first reset

    def spawn(self) -> LaggingParityEnv:
        env = super().spawn()
        assert isinstance(env, LaggingParityEnv)
        env._started = self._started  # every episode's copy sees the same starts
        return env

    def _event(self, index: int) -> anyio.Event:
        return self._started.setdefault(index, anyio.Event())

    async def reset(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        index = int(task["id"].rsplit("-", 1)[1])
        self._event(index).set()
        if index % 4 == 1:
            with anyio.move_on_after(float(self.options.get("max_wait_s", 2.0))):
                await self._event(index + int(self.options.get("lag", 7))).wait()
        return await super().reset(task)


class RecurringParityEnv(ParityEnv):
    """The same `size` task ids every epoch (a dataset's tasks recur; a curriculum tracks them)."""

    name = "recurring_parity"

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
        n = int(self.options.get("size", 3))
        for i in range(n):
            yield {"id": f"{split}-{(i + seed) % n}", "question": f"Say something ({i})."}
