"""The step's objective, assembled from the registries of :mod:`agentrl.algos` by name.

    objective = Objective(AlgorithmSettings(), attribution="soft", norm_length=512)
    outcomes, shaping = objective.shaped_rewards(batch)
    advantages, loss_mask, returns = objective.advantages(batch, outcomes, values)
    loss, metrics = objective.loss(logprobs, entropy, values, ...)   # one micro-batch

The loss is the policy loss (with its off-policy correction), minus the entropy bonus,
plus the KL penalty to a reference policy (unless ``algorithm.kl_in_reward`` folds it into
the per-token rewards, REINFORCE++-style), plus the value loss when the advantage
estimator needs a critic. DAPO's overlong filter takes truncated samples out of the loss.

One idea a module: ``algorithm.options`` and the clip settings are routed by
:mod:`agentrl.learner.options`; the rules between settings are :mod:`agentrl.learner.checks`;
rewards become advantages in :mod:`agentrl.learner.credit` (estimators and losses get the
typed inputs they declare, :class:`~agentrl.algos.AdvantageInputs` /
:class:`~agentrl.algos.LossInputs`); adaptive-KL PPO's state is
:mod:`agentrl.learner.adaptive_kl`. This module assembles them and computes the loss.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor

from agentrl.algos import aggregate, estimate_advantages, kl_divergence, policy_loss, value_loss
from agentrl.algos.registry import (
    ADVANTAGES,
    AGGREGATIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    TREE_ATTRIBUTIONS,
    AdvantageInputs,
    LossInputs,
    input_docs,
    keyword_parameters,
)
from agentrl.algos.stats import masked_mean
from agentrl.errors import ConfigError
from agentrl.learner.adaptive_kl import AdaptiveKLState
from agentrl.learner.checks import (
    check_critic,
    check_dynamic_sampling,
    check_entropy_schedule,
    check_kl_in_reward,
    check_off_policy,
)
from agentrl.learner.credit import Credit, turn_index
from agentrl.learner.metrics import unscaled
from agentrl.learner.options import CLIP_SETTINGS, clip_settings, lookup, route_options
from agentrl.learner.schedule import coef_at
from agentrl.learner.settings import AlgorithmSettings, ObjectiveSettings
from agentrl.types import Batch

__all__ = ["ADVANTAGE_INPUTS", "LOSS_INPUTS", "Objective", "check_algorithm", "turn_index"]

# what an estimator / a policy loss may declare, field -> what it holds (docs, errors)
ADVANTAGE_INPUTS = input_docs(AdvantageInputs)
LOSS_INPUTS = input_docs(LossInputs)
# keywords the learner passes itself: an option may not take them over
_RESERVED = (
    frozenset(keyword_parameters(estimate_advantages)[0])
    | frozenset(keyword_parameters(policy_loss)[0])
    | frozenset(ADVANTAGE_INPUTS)
    | frozenset(LOSS_INPUTS)
    | frozenset(CLIP_SETTINGS)
)


class Objective:
    """Advantages and the per-micro-batch loss that ``algorithm`` (the config section) names.

    Every name is checked when this is built, so a typo fails before the first step.
    """

    @classmethod
    def from_settings(cls, settings: ObjectiveSettings) -> Objective:
        return cls(
            settings.algorithm,
            attribution=settings.attribution,
            norm_length=settings.norm_length,
            step_weight=settings.step_weight,
        )

    def __init__(
        self,
        alg: AlgorithmSettings,
        *,
        attribution: str,
        norm_length: int,
        step_weight: float = 1.0,
    ) -> None:
        self.alg = alg
        self.attribution = attribution
        self.norm_length = norm_length
        self.step_weight = float(step_weight)
        # unknown names raise with suggestions, naming the config field
        advantage_fn = lookup(ADVANTAGES, alg.advantage, "algorithm.advantage")
        loss_fn = lookup(POLICY_LOSSES, alg.policy_loss, "algorithm.policy_loss")
        if alg.kl:
            lookup(KL_ESTIMATORS, alg.kl, "algorithm.kl")
        lookup(AGGREGATIONS, alg.agg, "algorithm.agg")
        lookup(TREE_ATTRIBUTIONS, attribution, "rollout.branching.attribution")
        self.token_unit = AGGREGATIONS.unit(alg.agg) == "token"
        self.needs_critic = ADVANTAGES.needs_critic(alg.advantage)
        check_critic(alg, self.needs_critic)
        check_off_policy(alg)
        check_kl_in_reward(alg)
        check_dynamic_sampling(alg)
        check_entropy_schedule(alg)
        # the step's entropy coefficient (algorithm.entropy_coef_schedule: begin_step)
        self.entropy_coef = coef_at(
            alg.entropy_coef_schedule, alg.entropy_coef, alg.entropy_coef_end, 0, 1
        )
        # use_kl: a reference model is needed; the KL goes into the loss or into the rewards
        self.use_kl = bool(alg.kl) and alg.kl_coef > 0
        self.kl_in_loss = self.use_kl and not alg.kl_in_reward
        self.loglinear = alg.off_policy == "decoupled" and alg.proximal == "loglinear"
        adv_label = f"advantage '{alg.advantage}'"
        loss_label = f"policy loss '{alg.policy_loss}'"
        routed = route_options(
            alg.options, {adv_label: advantage_fn, loss_label: loss_fn}, _RESERVED
        )
        self.advantage_options = routed[adv_label]
        self.credit = Credit(
            alg, attribution=attribution, step_weight=step_weight, options=self.advantage_options
        )
        self.loss_inputs = POLICY_LOSSES.inputs(alg.policy_loss)
        self.couples_group = POLICY_LOSSES.couples_group(alg.policy_loss)
        # a reference model is loaded for the KL term or for a loss that reads it
        self.needs_ref = self.use_kl or "ref_logprobs" in self.loss_inputs
        if alg.ref_refresh_every and not self.needs_ref:
            raise ConfigError(
                f"algorithm.ref_refresh_every={alg.ref_refresh_every} refreshes the reference "
                "model, but this run has none: set algorithm.kl and algorithm.kl_coef > 0 (or "
                "pick a loss that reads ref_logprobs), or remove algorithm.ref_refresh_every"
            )
        self.loss_options = {**clip_settings(alg, loss_fn), **routed[loss_label]}
        # a loss naming kl_beta and kl_target gets beta adapted between steps (adaptive-KL PPO)
        self.adaptive_kl: AdaptiveKLState | None = None
        if {"kl_beta", "kl_target"} <= set(keyword_parameters(loss_fn)[0]):
            defaults = inspect.signature(loss_fn).parameters
            beta = self.loss_options.get("kl_beta", defaults["kl_beta"].default)
            target = self.loss_options.get("kl_target", defaults["kl_target"].default)
            self.adaptive_kl = AdaptiveKLState(beta, target, self.loss_options)

    # --- before the updates (credit: agentrl.learner.credit) -----------------------------

    def shaped_rewards(self, batch: Batch) -> tuple[Tensor, dict[str, float]]:
        """The outcomes ``[B]`` advantages are computed from (DAPO's overlong shaping when
        it is on)."""
        return self.credit.shaped_outcomes(batch)

    def process_rewards(self, batch: Batch) -> Tensor | None:
        return self.credit.process_rewards(batch)

    def sequence_returns(self, batch: Batch, outcomes: Tensor) -> Tensor:
        """What a sequence-level estimator trains on: outcome plus weighted step rewards."""
        return self.credit.sequence_returns(batch, outcomes)

    def token_rewards(self, batch: Batch, outcomes: Tensor) -> Tensor:
        return self.credit.token_rewards(batch, outcomes)

    def kl_rewards(
        self, batch: Batch, outcomes: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor
    ) -> tuple[Tensor, dict[str, float]]:
        return self.credit.kl_rewards(batch, outcomes, old_logprobs, ref_logprobs)

    def filter_truncated(self, batch: Batch, loss_mask: Tensor) -> tuple[Tensor, dict[str, float]]:
        return self.credit.filter_truncated(batch, loss_mask)

    def advantages(
        self,
        batch: Batch,
        outcomes: Tensor,
        values: Tensor | None,
        token_rewards: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """(advantages [B, T], loss_mask [B, T], value targets [B, T] or None): see
        :meth:`agentrl.learner.credit.Credit.advantages`."""
        if self.adaptive_kl is not None:
            self.adaptive_kl.adapt()
        return self.credit.advantages(batch, outcomes, values, token_rewards)

    @property
    def _step_inputs(self) -> dict[str, Tensor]:
        return self.credit.step_inputs

    def begin_step(self, step: int, total_steps: int) -> float:
        """Set the entropy coefficient of learner step `step` (0-based) of `total_steps`
        (``algorithm.entropy_coef_schedule``) and return it."""
        alg = self.alg
        self.entropy_coef = coef_at(
            alg.entropy_coef_schedule, alg.entropy_coef, alg.entropy_coef_end, step, total_steps
        )
        return self.entropy_coef

    # --- adaptive KL across steps (agentrl.learner.adaptive_kl) --------------------------

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must carry for a resumed run to continue this objective exactly:
        the adaptive-KL beta and the KL seen since it was last adapted ({} for the rest)."""
        return {} if self.adaptive_kl is None else self.adaptive_kl.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; a checkpoint without it keeps the configured beta."""
        saved = state.get("adaptive_kl")
        if self.adaptive_kl is not None and saved:
            self.adaptive_kl.load_state_dict(saved)

    def end_step(self, sum_over_ranks: Callable[[Tensor], Tensor] | None = None) -> None:
        """Close a training step for adaptive KL (a collective when `sum_over_ranks` is
        given: every rank calls it at the same point)."""
        if self.adaptive_kl is not None:
            self.adaptive_kl.end_step(sum_over_ranks)

    def denominator(self, loss_mask: Tensor) -> float:
        """What a minibatch's loss is divided by (its tokens or its sequences), so that
        micro-batches accumulate to the minibatch's loss."""
        return float(loss_mask.sum()) if self.token_unit else float(len(loss_mask))

    @property
    def _unit_agg(self) -> str:
        """``agg`` as :func:`~agentrl.learner.metrics.unscaled` counts it."""
        return "token-mean" if self.token_unit else self.alg.agg

    # --- one micro-batch ---------------------------------------------------------------

    def loss(
        self,
        logprobs: Tensor,
        entropy: Tensor | None,
        values: Tensor | None,
        *,
        mask: Tensor,
        old_logprobs: Tensor,
        behavior_logprobs: Tensor,
        advantages: Tensor,
        ref_logprobs: Tensor | None,
        old_values: Tensor | None,
        returns: Tensor | None,
        denominator: float,
        rows: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        """The micro-batch's share of the minibatch loss, and its metrics (local means).

        `rows`: the micro-batch's rows in the step's batch, for the inputs a policy loss
        declares (:class:`~agentrl.algos.LossInputs`)."""
        alg = self.alg
        agg_kw: dict[str, Any] = {"norm_length": self.norm_length, "denominator": denominator}
        declared: dict[str, Any] = {}
        for key in self.loss_inputs:
            if key == "ref_logprobs":
                declared[key] = ref_logprobs
            elif rows is None:
                raise ValueError(
                    f"policy loss '{alg.policy_loss}' reads {key}: pass rows= (the "
                    "micro-batch's rows in the batch Objective.advantages saw)"
                )
            else:
                declared[key] = self.credit.step_inputs[key][rows.cpu()].to(logprobs.device)
        pg, pg_metrics = policy_loss(
            alg.policy_loss,
            logprobs,
            old_logprobs,
            advantages,
            mask,
            agg=alg.agg,
            behavior_logprobs=behavior_logprobs,
            correction=alg.off_policy,
            is_cap=alg.is_cap,
            is_mode=alg.is_mode,
            is_level=alg.is_level,
            is_mask=alg.is_mask,
            is_mask_low=alg.is_mask_low,
            is_mask_high=alg.is_mask_high,
            **self.loss_options,
            **declared,
            **agg_kw,
        )
        if self.adaptive_kl is not None:
            self.adaptive_kl.observe(pg_metrics)
        metrics = {f"pg/{k}": v for k, v in pg_metrics.items() if k != "pg_loss"}
        loss = pg
        metrics["loss/pg"] = unscaled(pg, mask, denominator, self._unit_agg)
        if entropy is not None:
            # through the graph only when it is in the loss
            ent = entropy if self.entropy_coef else entropy.detach()
            ent_term = aggregate(alg.agg, ent, mask, **agg_kw)
            metrics["loss/entropy"] = unscaled(ent_term, mask, denominator, self._unit_agg)
            metrics["entropy"] = masked_mean(entropy, mask)
            if self.entropy_coef:
                loss = loss - self.entropy_coef * ent_term
        if ref_logprobs is not None and self.kl_in_loss:
            assert alg.kl is not None
            kl_tok = kl_divergence(alg.kl, logprobs, ref_logprobs)
            kl_term = aggregate(alg.agg, kl_tok, mask, **agg_kw)
            loss = loss + alg.kl_coef * kl_term
            metrics["loss/kl"] = unscaled(kl_term, mask, denominator, self._unit_agg)
            metrics["kl"] = masked_mean(kl_tok, mask)
        if values is not None:
            assert old_values is not None and returns is not None
            vl, vl_metrics = value_loss(
                values,
                old_values,
                returns,
                mask,
                clip=alg.value_clip if alg.value_clip > 0 else None,
                agg=alg.agg,
                **agg_kw,
            )
            loss = loss + alg.vf_coef * vl
            metrics["loss/value"] = unscaled(vl, mask, denominator, self._unit_agg)
            metrics.update({f"value/{k}": v for k, v in vl_metrics.items() if k != "vf_loss"})
        return loss, metrics

    # --- after the updates -------------------------------------------------------------

    def entropy_metrics(self, entropy: Tensor, loss_mask: Tensor) -> dict[str, float]:
        """Entropy of the policy at the start of the step, over the trained tokens."""
        term = aggregate(self.alg.agg, entropy, loss_mask, norm_length=self.norm_length)
        return {"entropy": masked_mean(entropy, loss_mask), "loss/entropy": term.detach()}


def check_algorithm(settings: ObjectiveSettings) -> Objective:
    """Every registry name and option of a run (``algorithm``, the branching attribution,
    ``reward.step_weight``) checked before any model loads."""
    return Objective.from_settings(settings)
