"""Rewards beyond the environment's: plain Python functions, reward models, an LLM judge.

    reward:
      functions: [my_pkg.rewards:correct, my_pkg.rewards:concise]
      weights: [1.0, 0.2]
      model: runs/rm            # agentrl rm train prefs.jsonl --model ... --out runs/rm
      judge: {model: smollm2-135m-instruct}

See docs/bring_your_own.md. :class:`RewardPipeline` composes them per episode.
"""

from agentrl.rewards.functions import RewardFunction, RewardFunctionFailed, check_reward
from agentrl.rewards.pipeline import RewardPipeline, final_answer

__all__ = [
    "RewardFunction",
    "RewardFunctionFailed",
    "RewardPipeline",
    "check_reward",
    "final_answer",
]
