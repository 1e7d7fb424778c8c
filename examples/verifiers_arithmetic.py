"""A verifiers 0.3 environment as its users write it (plain `verifiers`, no agentrl import):
two-number sums from a local dataset, one reply, scored by a rubric. agentrl trains it
unchanged with ``env.name: verifiers`` (configs/verifiers_arithmetic.yaml,
docs/ecosystem.md); ``vf-eval`` would load it the same way. Needs verifiers 0.3.x; the
verifiers 0.4 version is examples/verifiers_v1/vf_arithmetic.py."""

from __future__ import annotations

import random
import re

import verifiers as vf
from datasets import Dataset

SYSTEM = "Answer with the number only."


def _rows(n: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, 30), rng.randint(1, 30)
        rows.append({"question": f"What is {a} + {b}?", "answer": str(a + b)})
    return rows


def correct_answer(completion, answer, **kwargs) -> float:
    """1 when the last number of the reply is the sum."""
    text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
    numbers = re.findall(r"-?\d+", str(text or ""))
    return 1.0 if numbers and numbers[-1] == answer else 0.0


def brevity(completion, **kwargs) -> float:
    """A metric (weight 0): the reply's length in characters."""
    text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
    return float(len(str(text or "")))


def load_environment(num_train: int = 2000, num_eval: int = 64) -> vf.Environment:
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(_rows(num_train, seed=0)),
        eval_dataset=Dataset.from_list(_rows(num_eval, seed=1)),
        system_prompt=SYSTEM,
        rubric=vf.Rubric(funcs=[correct_answer, brevity], weights=[1.0, 0.0]),
    )
