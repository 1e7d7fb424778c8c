"""A single-turn verifiers v1 taskset from a small local dataset ("What is i + 1?"),
written as a verifiers 0.4 user writes one: a Taskset, its Task with @vf.reward and
@vf.metric, and the harness its agent plays (no agentrl import)."""

from __future__ import annotations

import verifiers.v1 as vf
from vf_chat_harness import ChatHarness, ChatHarnessConfig


class AddOneConfig(vf.TasksetConfig):
    num_examples: int = 8


class AddOneData(vf.TaskData):
    answer: str


class AddOneTask(vf.Task[AddOneData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def contains_answer(self, task, trace) -> float:
        """1 when the last reply contains the answer."""
        return 1.0 if task.answer in (trace.last_reply or "") else 0.0

    @vf.metric
    async def reply_length(self, trace) -> float:
        return float(len(trace.last_reply or ""))


class AddOneTaskset(vf.Taskset[AddOneTask, AddOneConfig]):
    def load(self):
        for i in range(self.config.num_examples):
            data = AddOneData(
                id=str(i),
                prompt=f"What is {i} + 1?",
                system_prompt="Answer with a number.",
                answer=str(i + 1),
            )
            yield AddOneTask(data, self.config.task)


__all__ = ["AddOneConfig", "AddOneTask", "AddOneTaskset", "ChatHarness", "ChatHarnessConfig"]
