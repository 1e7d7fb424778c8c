"""The learner step's update stage: ``ppo_epochs`` x ``minibatches`` optimizer updates.

Each minibatch is split into micro-batches (:mod:`agentrl.learner.batching`) whose
gradients accumulate on the trainer core (:mod:`agentrl.learner.core`), every micro-batch
loss divided by the whole minibatch's token / sequence count, so accumulation equals one
big batch. pi_old comes from the start-of-step pass, from the update's own forward
(detached), or interpolated by version (``proximal: loglinear``). Then the step's metrics,
summed over the ranks. The stages before it: :mod:`agentrl.learner.passes`; the step that
runs them: :meth:`agentrl.learner.Learner.step`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from agentrl.algos import loglinear_proximal_logprobs
from agentrl.devices import to_device, to_host
from agentrl.learner.batching import BatchLayout, minibatch_rows
from agentrl.learner.core import TrainerCore
from agentrl.learner.distributed import Ranks, rank_micro_batches
from agentrl.learner.forward import PolicyForward
from agentrl.learner.metrics import WeightedMeans, batch_metrics
from agentrl.learner.objective import Objective
from agentrl.learner.passes import StartPass
from agentrl.learner.settings import TrainSettings
from agentrl.types import Batch


class UpdateHost(Protocol):
    """What the update stage reads from the learner (:class:`~agentrl.learner.Learner`)."""

    lcfg: TrainSettings
    objective: Objective
    model: Any
    forward: PolicyForward
    core: TrainerCore
    ranks: Ranks
    device: torch.device
    generator: torch.Generator
    use_critic: bool
    version: int

    def phase(self, name: str) -> None: ...


@dataclass
class UpdateRecord:
    """The update loop's record: updates taken, their losses and gradient norms."""

    updates: int = 0
    grad_norms: list[float] = field(default_factory=list)
    losses: list[Tensor | float] = field(default_factory=list)  # this rank's share
    nonfinite: int = 0
    skipped: int = 0  # fp16 updates the gradient scaler skipped (a gradient overflowed)


@dataclass
class UpdateInputs:
    """What every micro-batch of a step's updates reads (and the records it appends to)."""

    batch: Batch
    layout: BatchLayout
    loss_mask: Tensor
    advantages: Tensor
    old_lp: Tensor
    ref_lp: Tensor | None
    old_values: Tensor | None
    returns: Tensor | None
    used_old_lp: Tensor
    first_pass_lp: Tensor | None
    # (host target [B, T], rows, length, device values): read in one transfer at the end
    pending: list[tuple[Tensor, Tensor, int, Tensor]]
    means: WeightedMeans
    current: bool
    loglinear: bool
    n_updates: int
    with_entropy: bool = False
    epoch: int = 0
    updates: int = 0
    denominator: Any = None


def update_loop(learner: UpdateHost, inputs: UpdateInputs, measure_entropy: bool) -> UpdateRecord:
    """``ppo_epochs`` x ``minibatches`` updates of the trainer core, each over this
    rank's micro-batches of the minibatch; the lr schedule steps once at the end."""
    lcfg, objective = learner.lcfg, learner.objective
    batch, loss_mask = inputs.batch, inputs.loss_mask
    trained_rows = torch.nonzero(loss_mask.sum(dim=1) > 0).flatten()
    loop = UpdateRecord()
    learner.model.train()
    for epoch in range(lcfg.ppo_epochs):
        perm = trained_rows[torch.randperm(len(trained_rows), generator=learner.generator)]
        # entropy through the graph only when it is in the loss or not yet measured
        inputs.with_entropy = bool(objective.entropy_coef) or (measure_entropy and epoch == 0)
        inputs.epoch = epoch
        minibatches = [
            rows
            for rows in minibatch_rows(
                perm, batch.group_index, lcfg.minibatches, objective.couples_group
            )
            if len(rows)
        ]
        for i, mb_rows in enumerate(minibatches):
            inputs.denominator = objective.denominator(loss_mask[mb_rows])
            inputs.updates = loop.updates
            last = epoch == lcfg.ppo_epochs - 1 and i == len(minibatches) - 1
            done = learner.core.update(
                rank_micro_batches(inputs.layout, mb_rows, learner.ranks),
                lambda mb, counts: micro_batch_loss(learner, inputs, mb, counts),
                learner.phase,
                # the weights are the step's new version once its last update is done
                version_after=learner.version + 1 if last else None,
            )
            loop.updates += 1
            if done.grad_norm is not None:
                loop.grad_norms.append(done.grad_norm)
            else:
                loop.nonfinite += 1
            loop.skipped += int(done.overflowed)
            loop.losses.append(done.loss)
    pending = inputs.pending
    for (target, idx, L, _), values in zip(pending, to_host([p[3] for p in pending]), strict=True):
        target[idx, :L] = values
    learner.core.end_step()  # the lr schedule, once per learner step
    learner.model.eval()
    return loop


def micro_batch_loss(learner: UpdateHost, s: UpdateInputs, mb: Any, counts: bool) -> Tensor:
    """The loss of one micro-batch of an update (divided by the whole minibatch's
    count), its metrics and log-probs recorded for the step's end."""
    idx, L, P = mb
    dev = learner.device
    # host -> device without waiting (pinned); the forward finds the loss positions in
    # the host-side mask, so nothing here reads the device
    learner.phase("forward")
    batch, loss_mask = s.batch, s.loss_mask
    m = to_device(loss_mask[idx, :L], dev)
    lp, ent, values = learner.forward(
        learner.model,
        to_device(batch.input_ids[idx, :L], dev),
        loss_mask[idx, :L],
        with_entropy=s.with_entropy,
        with_values=learner.use_critic,
        prefix_len=P,
        lengths=s.layout.lengths[idx],
    )
    behavior = to_device(batch.behavior_logprobs[idx, :L], dev)
    if s.current:  # the weights this one update differentiates
        old = lp.detach()
    elif s.loglinear:  # pi_prox interpolated by version, no forward pass
        old = loglinear_proximal_logprobs(
            behavior,
            lp,
            to_device(batch.versions[idx, :L], dev),
            learner.version,
            theta_version=learner.version + s.updates / s.n_updates,
        )
    else:
        old = to_device(s.old_lp[idx, :L], dev)
    if s.epoch == 0 and counts:  # read to the host at the step's end
        s.pending.append((s.used_old_lp, idx, L, old.detach().float() * m))
    loss, mb_metrics = learner.objective.loss(
        lp,
        ent,
        values,
        mask=m,
        old_logprobs=old,
        behavior_logprobs=behavior,
        advantages=to_device(s.advantages[idx, :L], dev),
        ref_logprobs=_rows(s.ref_lp, idx, L, dev),
        old_values=_rows(s.old_values, idx, L, dev),
        returns=_rows(s.returns, idx, L, dev),
        denominator=s.denominator,
        rows=idx,
    )
    if counts:
        s.means.add(mb_metrics, float(loss_mask[idx, :L].sum()))
        if s.first_pass_lp is not None and s.epoch == 0:
            s.pending.append((s.first_pass_lp, idx, L, lp.detach()))
    return loss


def update_metrics(
    learner: UpdateHost,
    metrics: dict[str, Any],
    inputs: UpdateInputs,
    loop: UpdateRecord,
    start: StartPass,
    rewards: Tensor,
) -> None:
    """The step's metrics into `metrics`, summed over the ranks first; the adaptive KL
    adapts from the KL seen on every rank. Called after the version is bumped."""
    means, first_pass_lp, ranks, dev = (
        inputs.means,
        inputs.first_pass_lp,
        learner.ranks,
        learner.device,
    )
    if ranks.distributed:
        learner.phase("metrics all-reduce")
        means.all_reduce(ranks, dev)
        if first_pass_lp is not None:
            ranks.sum_(first_pass_lp, dev)
        ranks.sum_(inputs.used_old_lp, dev)
    learner.objective.end_step(lambda seen: ranks.sum_(seen, dev))
    if loop.losses:
        losses = torch.stack([torch.as_tensor(x, device=dev).float() for x in loop.losses])
        for total in ranks.sum_(losses, dev):
            means.add({"loss/total": total}, 1.0)
    metrics.update(means.means())
    if start.entropy is not None:
        metrics.update(learner.objective.entropy_metrics(start.entropy, inputs.loss_mask))
    learner_lp = start.prox_lp if start.prox_lp is not None else first_pass_lp
    metrics.update(
        batch_metrics(
            inputs.batch,
            rewards,
            inputs.advantages,
            inputs.loss_mask,
            learner_lp,
            loop.grad_norms,
            learner.version - 1,
        )
    )
    metrics["nonfinite_skipped"] = float(loop.nonfinite)
    if learner.core.scaler.is_enabled():
        metrics["learner/loss_scale"] = float(learner.core.scaler.get_scale())
        metrics["learner/skipped_steps"] = float(loop.skipped)
    metrics["lr"] = learner.core.lr
    metrics["version"] = float(learner.version)


def _rows(x: Tensor | None, rows: Tensor, length: int, device: torch.device) -> Tensor | None:
    """``x[rows, :length]`` on `device`, or None."""
    return None if x is None else to_device(x[rows, :length], device)
