"""``agentrl check mismatch``: how far the sampler's log-probs are from the learner's.

    report = anyio.run(measure_mismatch, cfg, 4)    # sample 4 groups, score them, compare

The configured sampler backend (hf, vllm, openai) samples a few episodes at version 0;
the learner, built as training builds it (its dtype, its kernels, the sampler's
temperature), recomputes the log-probs of every sampled token; the gap is reported with
the same statistics as the ``monitor/mismatch_*`` metrics of a training step
(:func:`agentrl.learner.monitors.mismatch_stats`): mean and max absolute difference, the
k3 estimate of KL(sampler || learner), and the Pearson correlation. A large gap biases
every on-policy update (the sampler is not the policy the loss believes it is): see
``algorithm.off_policy`` (tis) for the correction.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio
import torch

from agentrl.config import Config
from agentrl.learner.monitors import mismatch_stats
from agentrl.learner.settings import DistillSettings
from agentrl.run.components import load_learner
from agentrl.run.runtime import assemble
from agentrl.run.settings import resolve
from agentrl.types import Batch, TrajectoryGroup


async def measure_mismatch(cfg: Config, tasks: int = 4) -> dict[str, Any]:
    """Sample `tasks` groups with `cfg`'s sampler, score them with its learner; the
    mismatch statistics over every sampled token, plus what was measured."""
    run = await anyio.to_thread.run_sync(lambda: assemble(cfg, "rollout"))
    groups: list[TrajectoryGroup] = []

    async def keep(group: TrajectoryGroup) -> None:
        groups.append(group)

    async with run:
        await run.engine.produce(tasks, keep)
    return await anyio.to_thread.run_sync(score_groups, cfg, groups)


def score_groups(cfg: Config, groups: list[TrajectoryGroup]) -> dict[str, Any]:
    """The learner's log-probs of `groups`' sampled tokens against the sampler's."""
    settings = resolve(cfg, "train").learner
    assert settings is not None
    # the policy alone: a distillation teacher has nothing to do with the gap
    learner = load_learner(dataclasses.replace(settings, distill=DistillSettings()))
    try:
        batch = Batch.from_groups(groups, pad_token_id=learner.pad_token_id)
        learner_lp = learner.compute_logprobs(batch)
    finally:
        learner.close()
    mask = batch.loss_mask > 0
    stats = mismatch_stats(batch.behavior_logprobs[mask], learner_lp[mask])
    if not stats:
        return {"backend": cfg.sampler.backend, "tokens": 0.0}
    worst = int(torch.argmax((batch.behavior_logprobs - learner_lp).abs() * mask))
    row, col = divmod(worst, mask.shape[1])
    return {
        "backend": cfg.sampler.backend,
        "model": cfg.model.name,
        "episodes": float(batch.size),
        **stats,
        "worst_token": {
            "trajectory": batch.trajectories[row].traj_id,
            "position": col,
            "token_id": int(batch.input_ids[row, col]),
            "sampler_logprob": float(batch.behavior_logprobs[row, col]),
            "learner_logprob": float(learner_lp[row, col]),
        },
    }
