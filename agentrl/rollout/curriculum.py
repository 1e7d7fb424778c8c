"""A curriculum by running success rate (``orchestrator.curriculum: learnability``).

    curriculum = Curriculum(min_weight=0.1, seed=0)
    curriculum.observe(group)                    # after each rollout group
    if curriculum.keep(task, index): ...         # the task cursor asks before issuing

Each task (by its ``id``) has a running success rate p: an exponential moving average of
its groups' mean reward clipped to [0, 1] (the success rate for 0/1 rewards). A task is
issued with probability ``max(min_weight, 4 p (1 - p))``: 1 at p = 0.5, where a GRPO group
has the most signal (Foster et al. 2025, arXiv 2502.12272: "learnability" p (1 - p)), down to
``min_weight`` for tasks always or never solved, which still come back now and then. A task
never seen has weight 1. The draw for stream index i is a hash of (seed, i), so a resumed
run (the stats travel in the checkpoint) makes the same choices.
"""

from __future__ import annotations

import hashlib
from typing import Any

from agentrl.types import TrajectoryGroup

EMA = 0.5  # weight of a task's newest group in its running success rate


def _uniform(seed: int, index: int) -> float:
    """A deterministic draw in [0, 1) for stream index `index`."""
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


class Curriculum:
    """Running success rates per task id and the issue probability they give."""

    def __init__(self, min_weight: float = 0.1, seed: int = 0) -> None:
        if not 0.0 < min_weight <= 1.0:
            raise ValueError(f"curriculum min_weight must be in (0, 1] (got {min_weight})")
        self.min_weight = min_weight
        self.seed = seed
        self.success: dict[str, float] = {}  # task id -> running success rate
        self.skipped = 0  # tasks passed over since the last metrics()

    def weight(self, task_id: str) -> float:
        p = self.success.get(task_id)
        return 1.0 if p is None else max(self.min_weight, 4.0 * p * (1.0 - p))

    def keep(self, task: dict[str, Any], index: int) -> bool:
        """Whether the task at stream index `index` is issued (else passed over)."""
        kept = _uniform(self.seed, index) < self.weight(str(task.get("id", "")))
        self.skipped += not kept
        return kept

    def observe(self, group: TrajectoryGroup) -> None:
        """Fold a finished group's mean reward into its task's running success rate."""
        rewards = [min(1.0, max(0.0, t.reward)) for t in group.valid()]
        if not rewards:
            return
        rate = sum(rewards) / len(rewards)
        old = self.success.get(group.task_id)
        self.success[group.task_id] = rate if old is None else (1 - EMA) * old + EMA * rate

    def metrics(self) -> dict[str, float]:
        """Passed-over tasks since the last call, tasks tracked, their mean success rate."""
        out = {"curriculum/skipped": float(self.skipped), "curriculum/tasks": len(self.success)}
        if self.success:
            out["curriculum/success_mean"] = sum(self.success.values()) / len(self.success)
        self.skipped = 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"success": dict(self.success)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.success = {str(k): float(v) for k, v in state.get("success", {}).items()}
