"""What the learner trained each sample with: its advantage and the estimator that made it.

The learner records a :class:`StepCredit` after computing a step's advantages; the run
layer publishes it (:class:`agentrl.run.events.AdvantagesAssigned`) and the trace writer
stores it next to the trajectories, so a viewer shows the advantages that were trained
and never recomputes them (DESIGN.md §14).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class StepCredit:
    """One step's per-sample advantages, keyed by trajectory id.

    ``advantages[traj_id]``: the mean advantage over the sample's trained tokens (for a
    sequence-level estimator, its one advantage); None when no token of it was trained
    (an infrastructure error, a filtered truncation)."""

    estimator: str
    advantages: dict[str, float | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"estimator": self.estimator, "advantages": dict(self.advantages)}


def step_credit(
    estimator: str, traj_ids: list[str], advantages: Tensor, loss_mask: Tensor
) -> StepCredit:
    """The :class:`StepCredit` of a step from its advantages ``[B, T]`` and the loss mask
    the updates trained with (reduced where they are; two ``[B]`` vectors reach the host)."""
    mask = (loss_mask > 0).to(device=advantages.device, dtype=torch.float64)
    counts = mask.sum(dim=1)
    means = (advantages.detach().to(torch.float64) * mask).sum(dim=1) / counts.clamp(min=1.0)
    means, counts = means.cpu(), counts.cpu()
    return StepCredit(
        estimator=estimator,
        advantages={
            tid: (float(m) if c > 0 else None)
            for tid, m, c in zip(traj_ids, means.tolist(), counts.tolist(), strict=True)
        },
    )
