"""verifiers environments the tests train, written as a verifiers user writes them (plain
`verifiers` code, no agentrl import), each built from a small local dataset."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset


def _dataset(n: int) -> Dataset:
    return Dataset.from_list(
        [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(n)]
    )


def contains_answer(completion, answer, **kwargs) -> float:
    """1 when the last reply contains the answer."""
    text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
    return 1.0 if answer in str(text or "") else 0.0


def reply_length(completion, **kwargs) -> float:
    """A metric (weight 0): characters of the replies."""
    if isinstance(completion, list):
        return float(sum(len(str(m.get("content") or "")) for m in completion))
    return float(len(str(completion)))


def _rubric() -> vf.Rubric:
    return vf.Rubric(funcs=[contains_answer, reply_length], weights=[1.0, 0.0])


def load_single_turn(num_examples: int = 8) -> vf.Environment:
    return vf.SingleTurnEnv(
        dataset=_dataset(num_examples),
        eval_dataset=_dataset(2),
        system_prompt="Answer with a number.",
        rubric=_rubric(),
    )


class CheckAgainEnv(vf.MultiTurnEnv):
    """Asks the model to check its answer once: two model turns per rollout."""

    async def env_response(self, messages, state, **kwargs):
        return [{"role": "user", "content": "Check your answer and say it again."}]


def load_multi_turn(num_examples: int = 8) -> vf.Environment:
    return CheckAgainEnv(
        dataset=_dataset(num_examples),
        system_prompt="Answer with a number.",
        rubric=_rubric(),
        max_turns=2,
    )


def lookup(word: str) -> str:
    """Look a word up in the dictionary.

    Args:
        word: the word to look up
    """
    return f"{word}: a number word"


def load_tool_env(num_examples: int = 4) -> vf.Environment:
    return vf.ToolEnv(dataset=_dataset(num_examples), tools=[lookup], max_turns=3, rubric=_rubric())


def load_environment(**kwargs) -> vf.Environment:
    """What `vf-eval tests.envs.vf_envs` (and env.options.id) loads."""
    return load_single_turn(**kwargs)
