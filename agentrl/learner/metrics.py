"""What a learner step reports: per-micro-batch terms averaged, and the batch's statistics.

Rewards, lengths, advantages, staleness of the trained tokens, and the gap between the
sampler's and the learner's log-probs (by staleness), as flat float metrics.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch import Tensor

from agentrl.types import Batch


def valid_mean(x: Tensor, valid: Tensor) -> float:
    """Mean of ``x [B]`` over valid rows (0 when there are none)."""
    n = valid.sum()
    return float((x.float() * valid).sum() / n) if n > 0 else 0.0


def unscaled(term: Tensor, mask: Tensor, denominator: float, agg: str) -> Tensor:
    """A micro-batch term divided by the minibatch's count -> its own local mean (a 0-dim
    tensor on the term's device: no host synchronisation)."""
    local = mask.sum() if agg == "token-mean" else (mask.sum(dim=1) > 0).sum()
    return term.detach().float() * denominator / local.float().clamp(min=1e-12)


class WeightedMeans:
    """Running weighted means of named metrics (micro-batches weighted by their tokens).
    Values may be 0-dim tensors on the learner's device; they stay there until
    :meth:`means`, which reads them all at once."""

    def __init__(self) -> None:
        self._sums: dict[str, Any] = defaultdict(float)
        self._weights: dict[str, float] = defaultdict(float)

    def add(self, metrics: dict[str, Any], weight: float) -> None:
        for k, v in metrics.items():
            self._sums[k] = self._sums[k] + v * weight
            self._weights[k] += weight

    def all_reduce(self, ranks: Any, device: torch.device) -> None:
        """Sum the sums and weights over the learner's ranks (``ranks``:
        :class:`~agentrl.learner.distributed.Ranks`), in one collective."""
        keys = ranks.union(self._sums)
        packed = torch.stack(
            [
                torch.as_tensor(self._sums.get(k, 0.0), device=device).float().reshape(())
                for k in keys
            ]
            + [torch.tensor(float(self._weights.get(k, 0.0)), device=device) for k in keys]
        )
        ranks.sum_(packed, device)
        self._sums = defaultdict(float, zip(keys, packed[: len(keys)].unbind(), strict=True))
        self._weights = defaultdict(float, zip(keys, packed[len(keys) :].tolist(), strict=True))

    def means(self) -> dict[str, float]:
        return as_floats({k: v / max(self._weights[k], 1e-12) for k, v in self._sums.items()})


def as_floats(metrics: dict[str, Any]) -> dict[str, float]:
    """`metrics` with its tensor values read to the host in one transfer."""
    keys = [k for k, v in metrics.items() if isinstance(v, Tensor)]
    out = {k: float(v) for k, v in metrics.items() if k not in keys}
    if keys:
        values = torch.stack([metrics[k].detach().float().reshape(()) for k in keys])
        out.update(zip(keys, values.tolist(), strict=True))
    return out


def batch_metrics(
    batch: Batch,
    rewards: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    learner_logprobs: Tensor | None,
    grad_norms: list[float],
    trained_version: int,
) -> dict[str, float]:
    """Statistics of the batch a step trained on.

    `rewards` are the shaped rewards, `learner_logprobs` the learner's log-probs at the
    start of the step (None when not measured), `trained_version` the weights' version
    that trained on the batch.
    """
    valid = batch.valid
    m = loss_mask > 0
    out: dict[str, float] = {
        "reward/mean": valid_mean(batch.rewards, valid),
        "reward/shaped_mean": valid_mean(rewards, valid),
        "samples": float(batch.size),
        "samples/valid": float(valid.sum()),
        "samples/infra_masked": float((valid == 0).sum()),
        "tokens/trained": float(m.sum()),
        "tokens/total": float(batch.attention_mask.sum()),
        "response_length/mean": valid_mean(batch.response_lengths.float(), valid),
        "response_length/max": float(batch.response_lengths.max()),
        "grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else 0.0,
        "grad_norm/max": max(grad_norms) if grad_norms else 0.0,
        "optimizer_steps": float(len(grad_norms)),
    }
    sel = advantages[m]
    if sel.numel():
        out.update(
            {
                "advantage/mean": float(sel.mean()),
                "advantage/std": float(sel.std()) if sel.numel() > 1 else 0.0,
                "advantage/min": float(sel.min()),
                "advantage/max": float(sel.max()),
            }
        )
    staleness = trained_version - batch.versions
    st = staleness[m]
    if st.numel():
        out["staleness/mean"] = float(st.float().mean())
        out["staleness/max"] = float(st.max())
        for s, c in zip(*torch.unique(st, return_counts=True), strict=True):
            out[f"staleness/tokens_{int(s)}"] = float(c)
    if learner_logprobs is not None and st.numel():
        gap = (batch.behavior_logprobs - learner_logprobs).abs()[m]
        out["logprob_gap/mean"] = float(gap.mean())
        out["logprob_gap/max"] = float(gap.max())
        # importance ratio pi_learner / pi_behavior at the start of the step
        ratio = torch.exp((learner_logprobs - batch.behavior_logprobs)[m].clamp(-20, 20))
        out["is_ratio/mean"] = float(ratio.mean())
        out["is_ratio/max"] = float(ratio.max())
        out["is_ratio/min"] = float(ratio.min())
        for s in torch.unique(st):
            out[f"logprob_gap/staleness_{int(s)}"] = float(gap[st == s].mean())
    return out
