"""Schedules: the learning rate (linear warmup, then constant, linear or cosine decay) and
the entropy coefficient (constant, or linear / cosine from its start to its end value)."""

from __future__ import annotations

import math
from collections.abc import Callable

SCHEDULES = ("constant", "linear", "cosine")


def lr_lambda(
    schedule: str, warmup_steps: int, total_steps: int, min_ratio: float = 0.0
) -> Callable[[int], float]:
    """Multiplier of the base lr at optimizer step `step` (for ``torch.optim.lr_scheduler.LambdaLR``).

    Warmup ramps linearly from ``1/(warmup+1)`` to 1 so the first step already trains;
    decay runs from the end of warmup to `total_steps`, down to `min_ratio`.
    """
    if schedule not in SCHEDULES:
        raise ValueError(
            f"learner.schedule must be one of {', '.join(SCHEDULES)} (got {schedule!r})"
        )
    if warmup_steps < 0:
        raise ValueError(f"learner.warmup_steps must be >= 0 (got {warmup_steps})")

    def fn(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        if schedule == "constant":
            return 1.0
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return min_ratio + (1.0 - min_ratio) * _decay(schedule, progress)

    return fn


def _decay(schedule: str, progress: float) -> float:
    """1 at progress 0, 0 at progress 1: a straight line or half a cosine."""
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def coef_at(schedule: str, start: float, end: float, step: int, total_steps: int) -> float:
    """A coefficient at learner step `step` (0-based): `start` throughout (``constant``),
    or from `start` at step 0 to `end` at the last step ``total_steps - 1``."""
    if schedule not in SCHEDULES:
        raise ValueError(
            f"algorithm.entropy_coef_schedule must be one of {', '.join(SCHEDULES)} "
            f"(got {schedule!r})"
        )
    if schedule == "constant":
        return start
    progress = min(1.0, max(0, step) / max(1, total_steps - 1))
    return end + (start - end) * _decay(schedule, progress)
