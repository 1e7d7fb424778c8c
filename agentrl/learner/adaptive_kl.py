"""Adaptive-KL PPO's state across steps: a loss naming ``kl_beta`` and ``kl_target`` gets
its beta adapted from the mean KL(pi_old || pi_theta) of the previous step, over every
learner rank, and a checkpoint carries it so a resumed run goes on with it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from agentrl.algos.family import AdaptiveKL


class AdaptiveKLState:
    """The adapted beta, written into the loss options it feeds (``loss_options["kl_beta"]``)."""

    def __init__(self, beta: float, target: float, loss_options: dict[str, Any]) -> None:
        self.rule = AdaptiveKL(beta, target)
        self.loss_options = loss_options
        self._kl_seen: list[Tensor] = []  # each micro-batch's KL in the step in progress
        self._last_kl: float | None = None  # the last ended step's mean KL, over every rank

    @property
    def beta(self) -> float:
        return self.rule.beta

    def observe(self, pg_metrics: Mapping[str, Any]) -> None:
        """A micro-batch's KL, from its policy-loss metrics."""
        if "kl_old_theta" in pg_metrics:
            self._kl_seen.append(torch.as_tensor(pg_metrics["kl_old_theta"]).detach())

    def adapt(self) -> None:
        """The last step's mean KL sets this step's beta (before its advantages)."""
        if self._kl_seen:  # used without a learner calling end_step: this process's KL
            self.end_step()
        if self._last_kl is not None:
            self.rule.update(self._last_kl)
        self._last_kl = None
        self.loss_options["kl_beta"] = self.rule.beta

    def end_step(self, sum_over_ranks: Callable[[Tensor], Tensor] | None = None) -> None:
        """Close a step: the mean KL of its micro-batches, over every rank when
        `sum_over_ranks` sums a tensor across the learner's ranks (a collective: every rank
        calls it at the same point). One host read a step."""
        seen = self._seen_kl()
        if sum_over_ranks is not None:
            seen = sum_over_ranks(seen)
        self._kl_seen = []
        if float(seen[1]) > 0:
            self._last_kl = float(seen[0] / seen[1])

    def state_dict(self) -> dict[str, Any]:
        seen = self._seen_kl()  # a step not ended by end_step: this process's KL
        pending = float(seen[0] / seen[1]) if seen[1] > 0 else self._last_kl
        return {"adaptive_kl": {"beta": self.rule.beta, "pending_kl": pending}}

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        """The checkpoint's adapted beta replaces the configured ``kl_beta``."""
        self.rule.beta = float(saved["beta"])
        self.loss_options["kl_beta"] = self.rule.beta
        pending = saved.get("pending_kl")
        self._kl_seen = []
        self._last_kl = None if pending is None else float(pending)

    def _seen_kl(self) -> Tensor:
        """[sum, count] (float64, host) of the KL of the micro-batches since the last
        :meth:`end_step`."""
        seen = torch.zeros(2, dtype=torch.float64)
        if self._kl_seen:
            seen[0] = float(torch.stack([k.detach().double() for k in self._kl_seen]).sum())
            seen[1] = len(self._kl_seen)
        return seen
