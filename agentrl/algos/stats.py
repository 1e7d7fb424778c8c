"""Masked statistics for metrics, kept on the tensors' device.

Each returns a detached 0-dim float32 tensor, so a learner can gather a step's metrics
without a host synchronisation per micro-batch and read them once at the end of the step
(0 where the mask selects nothing)."""

from __future__ import annotations

import torch
from torch import Tensor

# |log ratio| bound of every importance ratio: exp(20) is far past any clip, and finite
LOG_RATIO_CLAMP = 20.0


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    m = mask.to(torch.float32)
    return (x.detach().to(torch.float32) * m).sum() / m.sum().clamp(min=1.0)


def masked_max(x: Tensor, mask: Tensor) -> Tensor:
    return _masked_extreme(x, mask, largest=True)


def masked_min(x: Tensor, mask: Tensor) -> Tensor:
    return _masked_extreme(x, mask, largest=False)


def _masked_extreme(x: Tensor, mask: Tensor, *, largest: bool) -> Tensor:
    x = x.detach().to(torch.float32)
    if x.numel() == 0:
        return x.new_zeros(())
    selected = mask > 0
    fill = float("-inf") if largest else float("inf")
    masked = torch.where(selected, x, x.new_full((), fill))
    value = masked.amax() if largest else masked.amin()
    return torch.where(selected.any(), value, x.new_zeros(()))
