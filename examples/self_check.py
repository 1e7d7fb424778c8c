"""A workflow: the whole episode as one `async def` (train it: agentrl train examples/self_check.yaml).

The model answers an arithmetic question, is asked to check its work, and answers again;
the reward scores the final answer. `ctx.generate` keeps the sampled ids, behaviour
log-probs and weight versions; `ctx.finish` proves the rendered prefix, so the learner
trains exactly the sampled tokens and masks the user's follow-up.
"""

from __future__ import annotations

from agentrl.envs.verifiers import MathVerifier
from agentrl.rollout.workflow import EpisodeContext
from agentrl.types import Trajectory

SYSTEM = "Solve the problem. Put the final answer in \\boxed{}."
FOLLOW_UP = "Check your work step by step, then give the final answer in \\boxed{} again."
verifier = MathVerifier()


async def run_episode(ctx: EpisodeContext) -> Trajectory:
    chat = ctx.transcript(
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": ctx.task["question"]},
        ]
    )
    first = await ctx.generate(chat)
    chat.add_observation([{"role": "user", "content": FOLLOW_UP}])
    second = await ctx.generate(chat)
    reward, info = verifier.score(second, ctx.task)
    # a small bonus when the first answer was already right: checking is not a crutch
    first_reward, _ = verifier.score(first, ctx.task)
    info["first_correct"] = first_reward > 0
    return ctx.finish(chat, reward=reward + 0.1 * first_reward, info=info)
