"""What the orchestrator needs of a learner, wherever it computes.

:class:`~agentrl.learner.Learner` (in this process, driven from a worker thread) and
:class:`~agentrl.run.placement.learner_process.LearnerProcess` (a child process) both satisfy it, so the
code that drives training takes a :class:`LearnerLike` and never asks which it has.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from agentrl.learner.credit_record import StepCredit


@runtime_checkable
class LearnerLike(Protocol):
    """A learner: trains on groups, publishes weights, checkpoints, and is closed once."""

    version: int  # the policy version its current weights are (0 before the first step)
    step_count: int  # training steps taken
    # the advantages each sample of the last step trained with (None before the first step)
    last_credit: StepCredit | None

    def wait_ready(self) -> None:
        """Block until it can train (a child process has loaded its model); raises if it
        cannot start."""
        ...

    def step(self, groups: Sequence[Any]) -> dict[str, float]:
        """One training step on trajectory groups; flat float metrics. Blocking."""
        ...

    def state_dict_for_sampler(self, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
        """Version :attr:`version`'s weights on CPU, to publish to the samplers."""
        ...

    def sampler_weights(self) -> dict[str, Tensor] | None:
        """Version :attr:`version`'s live weights under the samplers' names, no copy made,
        when the publish may read them in place (a learner in this process: it trains again
        only once the publish has returned); None: publish :meth:`state_dict_for_sampler`."""
        ...

    def save_checkpoint(self, directory: str | Path) -> Path:
        """Everything needed to resume, written atomically into `directory`."""
        ...

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore what :meth:`save_checkpoint` wrote."""
        ...

    def close(self) -> None:
        """Release what it holds (a child process, shared memory); idempotent."""
        ...
