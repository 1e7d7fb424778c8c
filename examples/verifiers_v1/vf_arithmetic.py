"""examples/verifiers_arithmetic.py for verifiers 0.4 (``verifiers.v1``), as its users write
it (plain verifiers, no agentrl import): a Taskset of two-number sums from a local dataset,
its Task scored by a ``@vf.reward``, and the in-process chat harness its agent plays.
agentrl trains it unchanged (configs/verifiers_v1_arithmetic.yaml); ``vf eval vf-arithmetic``
would load it the same way with this folder on the path."""

from __future__ import annotations

import random
import re
from typing import Literal

import verifiers.v1 as vf
from vf_chat_harness import ChatHarness, ChatHarnessConfig

SYSTEM = "Answer with the number only."


class ArithmeticConfig(vf.TasksetConfig):
    split: Literal["train", "eval"] = "train"
    num_examples: int = 2000


class ArithmeticData(vf.TaskData):
    answer: str


class ArithmeticTask(vf.Task[ArithmeticData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct_answer(self, task, trace) -> float:
        """1 when the last number of the reply is the sum."""
        numbers = re.findall(r"-?\d+", trace.last_reply or "")
        return 1.0 if numbers and numbers[-1] == task.answer else 0.0

    @vf.metric
    async def brevity(self, trace) -> float:
        """The reply's length in characters."""
        return float(len(trace.last_reply or ""))


class ArithmeticTaskset(vf.Taskset[ArithmeticTask, ArithmeticConfig]):
    def load(self):
        rng = random.Random(0 if self.config.split == "train" else 1)
        for i in range(self.config.num_examples):
            a, b = rng.randint(1, 30), rng.randint(1, 30)
            data = ArithmeticData(
                id=f"{self.config.split}-{i}",
                prompt=f"What is {a} + {b}?",
                system_prompt=SYSTEM,
                answer=str(a + b),
            )
            yield ArithmeticTask(data, self.config.task)


__all__ = [
    "ArithmeticConfig",
    "ArithmeticTask",
    "ArithmeticTaskset",
    "ChatHarness",
    "ChatHarnessConfig",
]
