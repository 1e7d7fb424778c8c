"""The learner step's no-grad passes: what the credit and the loss read besides the batch.

- The start-of-step pass (when needed): the proximal log-probs for ``tis`` / ``decoupled``
  (not under ``proximal: loglinear``, which interpolates them per micro-batch instead, nor
  when they are the behaviour log-probs or, with one update per step, the update's own
  detached log-probs: see :mod:`agentrl.learner.proximal`), the critic's values when the
  advantage estimator needs them, and the exact sampler-vs-learner gap; reference log-probs
  when a KL term is on. Without the pass the gap is measured on the first update's forward.
- The teacher pass (on-policy distillation, :mod:`agentrl.learner.teacher`): each row's
  teacher scores the sampled tokens, and the reverse KL mixes into the advantages.

The stage after them: :mod:`agentrl.learner.update`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from agentrl.algos.distill import distill_advantages, reverse_kl
from agentrl.algos.stats import masked_mean
from agentrl.learner.batching import BatchLayout
from agentrl.learner.distributed import Ranks, whole_rows
from agentrl.learner.forward import PolicyForward
from agentrl.learner.objective import Objective
from agentrl.learner.settings import LearnerSettings, TrainSettings
from agentrl.learner.teacher import Teachers
from agentrl.types import Batch, TrajectoryGroup


class PassHost(Protocol):
    """What the no-grad passes read from the learner (:class:`~agentrl.learner.Learner`)."""

    settings: LearnerSettings
    lcfg: TrainSettings  # the train settings the step honours (share_prompt may be off)
    objective: Objective
    model: Any
    ref_model: Any
    teachers: Teachers | None
    forward: PolicyForward
    ranks: Ranks
    use_critic: bool
    bypass_blockers: list[str]
    current_blockers: list[str]
    version: int

    def phase(self, name: str) -> None: ...


@dataclass
class StartPass:
    """What the start-of-step pass found (None: not computed)."""

    current: bool
    loglinear: bool
    n_updates: int
    prox_lp: Tensor | None = None
    entropy: Tensor | None = None
    old_values: Tensor | None = None
    ref_lp: Tensor | None = None


def start_pass(
    learner: PassHost, batch: Batch, layout: BatchLayout, metrics: dict[str, Any]
) -> StartPass:
    """The no-grad pass at the start of a step, when needed (see the module docstring):
    the proximal log-probs, the start entropy, the critic's values; the reference
    log-probs when a KL term is on."""
    alg, lcfg, objective = learner.settings.algorithm, learner.lcfg, learner.objective
    trained_rows = torch.nonzero(batch.loss_mask.sum(dim=1) > 0).flatten()
    n_updates = lcfg.ppo_epochs * lcfg.minibatches
    loglinear = objective.loglinear
    # kl_in_reward: the KL of the learner's own log-probs, not the sampler's, against pi_ref
    need_prox = (not loglinear and (alg.off_policy != "none" or n_updates > 1)) or (
        learner.use_critic or alg.kl_in_reward
    )
    # pi_old is the behaviour policy: every trained token sampled by these weights
    bypass = (
        need_prox
        and not learner.bypass_blockers
        and bool((batch.versions[batch.loss_mask > 0] == learner.version).all())
    )
    # else, with one update, pi_old is what that update's forward computes (detached)
    current = need_prox and not bypass and not learner.current_blockers
    metrics["learner/proximal_bypass"] = float(bypass)
    metrics["learner/proximal_current"] = float(current)
    start = StartPass(current=current, loglinear=loglinear, n_updates=n_updates)
    t_fwd = time.perf_counter()
    no_grad_passes = 0  # counted, so a test can prove a pass was skipped
    if need_prox and not bypass and not current and len(trained_rows):
        no_grad_passes += 1
        learner.phase("no-grad pass")
        learner.model.eval()
        start.prox_lp, start.entropy, start.old_values = whole_rows(
            learner.forward,
            learner.model,
            batch,
            layout,
            trained_rows,
            learner.ranks,
            with_values=learner.use_critic,
            with_entropy=not objective.entropy_coef,
        )
    if learner.ref_model is not None and len(trained_rows):
        no_grad_passes += 1
        learner.phase("reference pass")
        start.ref_lp, _, _ = whole_rows(
            learner.forward, learner.ref_model, batch, layout, trained_rows, learner.ranks
        )
    metrics["time/no_grad_pass_s"] = time.perf_counter() - t_fwd
    metrics["learner/no_grad_passes"] = float(no_grad_passes)
    return start


def teacher_pass(
    learner: PassHost,
    groups: Sequence[TrajectoryGroup],
    batch: Batch,
    layout: BatchLayout,
    advantages: Tensor,
    loss_mask: Tensor,
    metrics: dict[str, Any],
) -> Tensor:
    """On-policy distillation's advantages (:mod:`agentrl.learner.teacher`): each row's
    teacher scores its sampled tokens; the reverse KL against the sampler's log-probs
    (the policy that drew them, whatever its version) mixes with the task advantages."""
    teachers = learner.teachers
    assert teachers is not None
    d = learner.settings.distill
    keys = teachers.row_keys(groups)
    learner.phase("teacher pass")
    t0 = time.perf_counter()

    def score_local(model: Any, rows: Tensor) -> Tensor:
        return whole_rows(learner.forward, model, batch, layout, rows, learner.ranks)[0]

    teacher_lp = teachers.logprobs(batch, keys, score_local)
    student_lp, mask = batch.behavior_logprobs, loss_mask
    rkl = reverse_kl(student_lp, teacher_lp, mask)
    metrics["distill/reverse_kl"] = float(masked_mean(rkl, mask))
    if len(teachers.keys) > 1:
        for key in teachers.keys:
            rows = torch.tensor([k == key for k in keys])
            if bool((mask[rows] > 0).any()):
                metrics[f"distill/reverse_kl/{key}"] = float(masked_mean(rkl[rows], mask[rows]))
    metrics["time/teacher_s"] = time.perf_counter() - t0
    return distill_advantages(
        student_lp,
        teacher_lp,
        mask,
        advantages,
        weight=d.weight,
        reward_weight=d.reward_weight,
    )
