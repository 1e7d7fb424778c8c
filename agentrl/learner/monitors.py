"""Health monitors of a step's batch (``monitor/*`` metrics): signs of reward hacking,
collapse and a sampler that disagrees with the learner.

- ``monitor/reward_std``: the std of the batch's outcomes (near 0: nothing to learn from);
- ``monitor/advantage_skew``: the skewness of the rows' mean advantages (a few rows paid far
  above the rest: a reward that a trick games);
- ``monitor/zero_variance_groups``: the share of groups whose samples all got one reward;
- ``monitor/response_length``: the mean response length (the run layer adds its drift
  against the first steps, ``monitor/length_drift``: :mod:`agentrl.run.monitors`);
- ``monitor/repetition`` (and ``_max``): per sample, the share of its generated n-grams
  (``monitors.ngram``) that repeat an earlier one, averaged over the batch;
- ``monitor/mismatch_*``: sampler vs learner log-probs on the tokens sampled by the weights
  the learner holds (staleness 0): mean and max absolute difference, the k3 estimate of
  KL(sampler || learner) and the Pearson correlation (:func:`mismatch_stats`);
- ``monitor/entropy``: the policy's mean entropy on the trained tokens.

The same mismatch numbers are what ``agentrl check mismatch`` reports.
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentrl.types import Batch


def mismatch_stats(sampler_logprobs: Tensor, learner_logprobs: Tensor) -> dict[str, float]:
    """Sampler vs learner log-probs of the same tokens (1-D): ``mean_abs``, ``max_abs``,
    ``kl_k3`` (Schulman's k3 of KL(sampler || learner): ``r - 1 - log r``, ``r = p_learner /
    p_sampler``, unbiased on tokens the sampler drew) and ``pearson``; {} without tokens."""
    s = sampler_logprobs.double().flatten()
    lrn = learner_logprobs.double().flatten()
    if s.numel() == 0:
        return {}
    diff = lrn - s
    log_r = diff.clamp(-20, 20)
    out = {
        "mean_abs": float(diff.abs().mean()),
        "max_abs": float(diff.abs().max()),
        "kl_k3": float((log_r.exp() - 1 - log_r).mean()),
        "tokens": float(s.numel()),
    }
    if s.numel() > 1 and float(s.std()) > 0 and float(lrn.std()) > 0:
        out["pearson"] = float(torch.corrcoef(torch.stack([s, lrn]))[0, 1])
    elif s.numel() > 1:
        out["pearson"] = 1.0 if bool(torch.equal(s, lrn)) else 0.0
    return out


def repetition(ids: list[int], n: int) -> float | None:
    """The share of the n-grams of `ids` that repeat an earlier one (None: fewer than n+1
    tokens, no n-gram can repeat)."""
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    if len(grams) < 2:
        return None
    return 1.0 - len(set(grams)) / len(grams)


def skewness(x: Tensor) -> float:
    """The sample skewness ``E[(x - mu)^3] / sigma^3`` (0 when x is constant)."""
    x = x.double()
    if x.numel() < 3:
        return 0.0
    centred = x - x.mean()
    sigma = centred.pow(2).mean().sqrt()
    if float(sigma) < 1e-12:
        return 0.0
    return float(centred.pow(3).mean() / sigma**3)


def batch_monitors(
    batch: Batch,
    advantages: Tensor,
    loss_mask: Tensor,
    learner_logprobs: Tensor | None,
    trained_version: int,
    *,
    ngram: int = 4,
) -> dict[str, float]:
    """The ``monitor/*`` metrics of one step's batch (see the module docstring).
    `learner_logprobs` ``[B, T]``: the learner's at the start of the step (None: not
    measured); `trained_version`: the weights' version that trained on the batch."""
    valid = batch.valid > 0
    out: dict[str, float] = {}
    rewards = batch.rewards[valid].double()
    out["monitor/reward_std"] = float(rewards.std(unbiased=False)) if rewards.numel() else 0.0
    m = loss_mask > 0
    trained = m.any(dim=1)
    if bool(trained.any()):
        row_adv = (advantages * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)
        out["monitor/advantage_skew"] = skewness(row_adv[trained])
    groups = batch.group_index[valid]
    if groups.numel():
        flat = 0
        ids = torch.unique(groups)
        for g in ids:
            r = rewards[groups == g]
            flat += int(float(r.max() - r.min()) < 1e-6)
        out["monitor/zero_variance_groups"] = flat / len(ids)
    lengths = batch.response_lengths[valid].double()
    if lengths.numel():
        out["monitor/response_length"] = float(lengths.mean())
    reps = [
        repetition(batch.input_ids[i][m[i]].tolist(), ngram)
        for i in range(batch.size)
        if bool(valid[i])
    ]
    reps_known = [r for r in reps if r is not None]
    if reps_known:
        out["monitor/repetition"] = sum(reps_known) / len(reps_known)
        out["monitor/repetition_max"] = max(reps_known)
    if learner_logprobs is not None:
        current = m & (batch.versions == trained_version)
        stats = mismatch_stats(batch.behavior_logprobs[current], learner_logprobs[current])
        out.update({f"monitor/mismatch_{k}": v for k, v in stats.items()})
    return out
