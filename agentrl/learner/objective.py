"""The step's objective, assembled from the registries of :mod:`agentrl.algos` by name.

    objective = Objective(AlgorithmSettings(), attribution="soft", norm_length=512)
    rewards, shaping = objective.shaped_rewards(batch)
    advantages, loss_mask, returns = objective.advantages(batch, rewards, values)
    loss, metrics = objective.loss(logprobs, entropy, values, ...)   # one micro-batch

The loss is the policy loss (with its off-policy correction), minus the entropy bonus,
plus the KL penalty to a reference policy (unless ``algorithm.kl_in_reward`` folds it into
the per-token rewards, REINFORCE++-style), plus the value loss when the advantage
estimator needs a critic. DAPO's overlong filter takes truncated samples out of the loss. ``algorithm.options`` reach the advantage estimator and the
policy loss by one rule (:func:`route_options`): each option goes to every one of the two
that names it as a keyword parameter (or takes ``**kwargs``); an option neither takes, or
one that shadows a setting the learner passes itself, is a :class:`ConfigError`.

Declared inputs: an advantage estimator gets every batch input of
:data:`ADVANTAGE_INPUTS` it names as a keyword parameter (turn spans, per-turn process
rewards, state keys, tree ids, ...), a policy loss every one of :data:`LOSS_INPUTS` it
names (reference log-probs, group ids, rewards, lengths), so a user's function gets them
without editing the learner. Step rewards (``reward.step_weight``): the environment's
process rewards sit on the last token of their turn for estimators that take per-token
rewards (GAE, REINFORCE++), reach estimators that name ``turn_rewards`` per turn (GiGPO),
and are added to the outcome for the other, sequence-level ones.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from agentrl._suggest import suggest
from agentrl.algos import (
    aggregate,
    estimate_advantages,
    kl_divergence,
    kl_penalized_rewards,
    overlong_filter,
    overlong_penalty,
    place_outcome_rewards,
    policy_loss,
    tree_advantages,
    tree_from_ids,
    value_loss,
)
from agentrl.algos.family import AdaptiveKL
from agentrl.algos.registry import (
    ADVANTAGES,
    AGGREGATIONS,
    KL_ESTIMATORS,
    OFF_POLICY_MASKS,
    POLICY_LOSSES,
    TREE_ATTRIBUTIONS,
    keyword_parameters,
)
from agentrl.algos.stats import masked_mean
from agentrl.algos.tree_grpo import tree_roots
from agentrl.errors import ConfigError, UnknownNameError
from agentrl.learner.metrics import unscaled, valid_mean
from agentrl.learner.settings import AlgorithmSettings, ObjectiveSettings
from agentrl.types import Batch, Trajectory

# the clip settings of algorithm.* that go to a policy loss naming them as parameters
CLIP_SETTINGS = ("eps_low", "eps_high", "dual_clip_c")

# keywords the learner passes itself, so an option may not take them over; where an
# algorithm.* field sets it, the error names that field
_SET_BY_FIELD = {
    "gamma": "algorithm.gamma",
    "lam": "algorithm.lam",
    "eps_low": "algorithm.eps_low",
    "eps_high": "algorithm.eps_high",
    "dual_clip_c": "algorithm.dual_clip_c",
    "agg": "algorithm.agg",
    "norm_length": "algorithm.norm_length",
    "correction": "algorithm.off_policy",
    "is_cap": "algorithm.is_cap",
    "is_mode": "algorithm.is_mode",
    "is_level": "algorithm.is_level",
    "is_mask": "algorithm.is_mask",
    "is_mask_low": "algorithm.is_mask_low",
    "is_mask_high": "algorithm.is_mask_high",
}
# batch inputs an advantage estimator gets by naming them as keyword parameters
ADVANTAGE_INPUTS = {
    "mask": "the loss mask [B, T] (1 on trained tokens)",
    "gamma": "algorithm.gamma",
    "tree_ids": "each row's branch tree (its root row) [B]",
    "turn_index": "the assistant turn of each trained token [B, T] (-1 elsewhere)",
    "turn_ends": "the last token of each turn [B, K] (-1 past a row's turns)",
    "turn_rewards": "process rewards per turn times reward.step_weight [B, K]",
    "turn_mask": "1.0 on a row's real turns [B, K]",
    "turn_states": "per row, the state key each turn acted from (list of lists)",
    "response_lengths": "tokens after the prompt [B]",
}
# batch inputs a policy loss gets by naming them (sliced to its micro-batch's rows)
LOSS_INPUTS = {
    "ref_logprobs": "the reference policy's log-probs [B, T] (loads a reference model)",
    "group_ids": "each row's group [B]",
    "rewards": "each row's reward [B] (outcome plus weighted process rewards)",
    "lengths": "trained tokens per row [B]",
}
_ADVANTAGE_INPUTS = frozenset(keyword_parameters(estimate_advantages)[0]) | set(ADVANTAGE_INPUTS)
_LOSS_INPUTS = frozenset(keyword_parameters(policy_loss)[0]) | set(CLIP_SETTINGS) | set(LOSS_INPUTS)


def route_options(
    options: Mapping[str, Any],
    receivers: Mapping[str, Callable[..., Any]],
    reserved: frozenset[str] = _ADVANTAGE_INPUTS | _LOSS_INPUTS,
) -> dict[str, dict[str, Any]]:
    """Split ``algorithm.options`` among `receivers` (a label such as ``"advantage 'grpo'"``
    -> its function): each option goes to every receiver that names it as a keyword
    parameter or takes ``**kwargs``. Raises :class:`ConfigError` for an option in
    `reserved` (the learner passes it) or one that no receiver takes."""
    routed: dict[str, dict[str, Any]] = {label: {} for label in receivers}
    signatures = {label: keyword_parameters(fn) for label, fn in receivers.items()}
    for key, value in options.items():
        if key in reserved:
            field = _SET_BY_FIELD.get(key)
            fix = f"set {field} instead" if field else "remove it from algorithm.options"
            raise ConfigError(
                f"algorithm.options.{key}: '{key}' is passed by the learner itself, not an "
                f"option; {fix}"
            )
        takers = [
            label for label, (named, takes_any) in signatures.items() if takes_any or key in named
        ]
        if not takers:
            takes = []
            for label, (named, _) in signatures.items():
                own = [p for p in named if p not in reserved]
                takes.append(f"{label} takes {', '.join(own) if own else 'no options'}")
            known = [p for named, _ in signatures.values() for p in named if p not in reserved]
            raise ConfigError(
                f"algorithm.options.{key} is not an option of any selected function"
                f"{suggest(key, known)}: {'; '.join(takes)}. Remove it, or pick an "
                "algorithm that takes it"
            )
        for label in takers:
            routed[label][key] = value
    return routed


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
        advantage_fn = _lookup(ADVANTAGES, alg.advantage, "algorithm.advantage")
        loss_fn = _lookup(POLICY_LOSSES, alg.policy_loss, "algorithm.policy_loss")
        if alg.kl:
            _lookup(KL_ESTIMATORS, alg.kl, "algorithm.kl")
        _lookup(AGGREGATIONS, alg.agg, "algorithm.agg")
        _lookup(TREE_ATTRIBUTIONS, attribution, "rollout.branching.attribution")
        self.token_unit = AGGREGATIONS.unit(alg.agg) == "token"
        self.needs_critic = ADVANTAGES.needs_critic(alg.advantage)
        if alg.critic and not self.needs_critic:
            raise ConfigError(
                f"algorithm.critic is true but algorithm.advantage is '{alg.advantage}', which "
                "uses no value function: set algorithm.critic=false, or pick an advantage "
                "that needs one (algorithm.advantage=gae)"
            )
        if self.needs_critic and not alg.critic:
            raise ConfigError(
                f"algorithm.advantage={alg.advantage} needs a value function: "
                "set algorithm.critic=true"
            )
        self._check_off_policy()
        self._check_kl_in_reward()
        # use_kl: a reference model is needed; the KL goes into the loss or into the rewards
        self.use_kl = bool(alg.kl) and alg.kl_coef > 0
        self.kl_in_loss = self.use_kl and not alg.kl_in_reward
        self.loglinear = alg.off_policy == "decoupled" and alg.proximal == "loglinear"
        adv_label = f"advantage '{alg.advantage}'"
        loss_label = f"policy loss '{alg.policy_loss}'"
        routed = route_options(alg.options, {adv_label: advantage_fn, loss_label: loss_fn})
        self.advantage_options = routed[adv_label]
        adv_named = keyword_parameters(advantage_fn)[0]
        self.advantage_inputs = [k for k in ADVANTAGE_INPUTS if k in adv_named]
        self.per_turn = "turn_rewards" in self.advantage_inputs
        self.loss_inputs = [k for k in LOSS_INPUTS if k in keyword_parameters(loss_fn)[0]]
        self.couples_group = POLICY_LOSSES.couples_group(alg.policy_loss)
        # a reference model is loaded for the KL term or for a loss that reads it
        self.needs_ref = self.use_kl or "ref_logprobs" in self.loss_inputs
        self.loss_options = {**self._clip_settings(loss_fn), **routed[loss_label]}
        self._step_inputs: dict[str, Tensor] = {}
        # a loss naming kl_beta and kl_target gets beta adapted between steps (adaptive-KL PPO)
        self.adaptive_kl: AdaptiveKL | None = None
        self._kl_seen: list[Tensor] = []  # each micro-batch's KL in the step in progress
        self._last_kl: float | None = None  # the last ended step's mean KL, over every rank
        if {"kl_beta", "kl_target"} <= set(keyword_parameters(loss_fn)[0]):
            defaults = inspect.signature(loss_fn).parameters
            beta = self.loss_options.get("kl_beta", defaults["kl_beta"].default)
            target = self.loss_options.get("kl_target", defaults["kl_target"].default)
            self.adaptive_kl = AdaptiveKL(beta, target)

    def _check_off_policy(self) -> None:
        """The is_* and proximal keys act only under a correction that uses them."""
        alg = self.alg
        if alg.off_policy == "none":
            for key in ("is_mode", "is_level", "is_mask", "proximal", "proximal_bypass"):
                if getattr(alg, key) != AlgorithmSettings.default(key):
                    raise ConfigError(
                        f"algorithm.{key}={getattr(alg, key)} has no effect with "
                        "algorithm.off_policy=none (pi_old is the behaviour policy, every "
                        "weight is 1): set algorithm.off_policy=tis or decoupled, or remove "
                        f"algorithm.{key}"
                    )
        if alg.proximal == "loglinear" and alg.off_policy != "decoupled":
            raise ConfigError(
                f"algorithm.proximal=loglinear approximates decoupled PPO's proximal policy; "
                f"with algorithm.off_policy={alg.off_policy} there is none: set "
                "algorithm.off_policy=decoupled or algorithm.proximal=recompute"
            )
        if alg.is_mask is None:
            for key in ("is_mask_low", "is_mask_high"):
                if key in alg.explicit:
                    raise ConfigError(
                        f"algorithm.{key} bounds a rejection mask, but algorithm.is_mask is "
                        "not set: set algorithm.is_mask=token (IcePop) or geometric, or "
                        f"remove algorithm.{key}"
                    )
        else:
            _lookup(OFF_POLICY_MASKS, alg.is_mask, "algorithm.is_mask")  # with suggestions
            if not alg.is_mask_low < alg.is_mask_high:
                raise ConfigError(
                    f"algorithm.is_mask_low ({alg.is_mask_low}) must be below "
                    f"algorithm.is_mask_high ({alg.is_mask_high})"
                )

    def _check_kl_in_reward(self) -> None:
        alg = self.alg
        if not alg.kl_in_reward:
            return
        if not alg.kl or alg.kl_coef <= 0:
            raise ConfigError(
                "algorithm.kl_in_reward=true needs a KL estimator and a coefficient: set "
                "algorithm.kl (k1, k2, k3 or k3+) and algorithm.kl_coef > 0 "
                f"(got kl={alg.kl}, kl_coef={alg.kl_coef})"
            )
        if not ADVANTAGES.takes_token_rewards(alg.advantage):
            takes = [n for n in ADVANTAGES.names() if ADVANTAGES.takes_token_rewards(n)]
            raise ConfigError(
                f"algorithm.kl_in_reward=true puts a KL penalty on every token, but "
                f"algorithm.advantage={alg.advantage} takes one reward per sequence: pick "
                f"one of {', '.join(takes)}, or keep the KL in the loss "
                "(algorithm.kl_in_reward=false)"
            )

    def _clip_settings(self, loss_fn: Callable[..., Any]) -> dict[str, Any]:
        """The clip settings `loss_fn` takes; one set in the config that it ignores is an error."""
        named, takes_any = keyword_parameters(loss_fn)
        out = {}
        for key in CLIP_SETTINGS:
            if takes_any or key in named:
                out[key] = getattr(self.alg, key)
            elif key in self.alg.explicit:
                raise ConfigError(
                    f"algorithm.{key} is set but policy loss '{self.alg.policy_loss}' takes no "
                    f"{key}; remove algorithm.{key} or pick a loss that clips (such as ppo)"
                )
        return out

    # --- before the updates ---------------------------------------------------------

    def shaped_rewards(self, batch: Batch) -> tuple[Tensor, dict[str, float]]:
        """The rewards advantages are computed from: DAPO's overlong shaping when it is on."""
        rewards = batch.rewards.clone()
        metrics: dict[str, float] = {}
        process = self.process_rewards(batch)
        if process is not None:
            metrics["reward/process_sum_mean"] = valid_mean(process.sum(dim=1), batch.valid)
        overlong = self.alg.overlong
        if not overlong.enabled:
            return rewards, metrics
        lengths = batch.response_lengths
        penalty = overlong.coef * overlong_penalty(lengths, overlong.max_len, overlong.cache_len)
        rewards = rewards + penalty * batch.valid
        metrics["overlong_penalty_mean"] = valid_mean(penalty, batch.valid)
        return rewards, metrics

    def process_rewards(self, batch: Batch) -> Tensor | None:
        """Per-turn process rewards times ``reward.step_weight`` ``[B, K]``; None when the
        batch has none (or the weight is 0)."""
        if self.step_weight == 0 or batch.turn_rewards is None:
            return None
        if not bool((batch.turn_rewards != 0).any()):
            return None
        return batch.turn_rewards * self.step_weight * batch.valid[:, None]

    def token_rewards(self, batch: Batch, rewards: Tensor) -> Tensor:
        """Per-token rewards ``[B, T]``: the outcome `rewards` ``[B]`` on each row's last
        trained token plus the weighted process rewards on the last token of their turn."""
        out = place_outcome_rewards(rewards, batch.loss_mask)
        return out + self._process_tokens(batch)

    def _process_tokens(self, batch: Batch) -> Tensor:
        """The weighted process rewards scattered onto each turn's last token ``[B, T]``."""
        out = torch.zeros(batch.loss_mask.shape, dtype=torch.float32)
        process = self.process_rewards(batch)
        if process is None:
            return out
        ends = batch.turn_ends
        has = ends >= 0
        rows = torch.arange(ends.shape[0])[:, None].expand_as(ends)
        out.index_put_((rows[has], ends[has]), process[has].float(), accumulate=True)
        return out * (batch.loss_mask > 0)

    def kl_rewards(
        self, batch: Batch, rewards: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor
    ) -> tuple[Tensor, dict[str, float]]:
        """Per-token rewards ``[B, T]`` for ``algorithm.kl_in_reward``: the outcome on each
        row's last trained token minus ``kl_coef`` times the KL estimate of pi_old against
        the reference policy on every trained token."""
        alg = self.alg
        assert alg.kl is not None
        mask = batch.loss_mask * batch.valid[:, None]
        kl = kl_divergence(alg.kl, old_logprobs, ref_logprobs) * mask
        token_rewards = kl_penalized_rewards(rewards, kl, mask, alg.kl_coef)
        token_rewards = token_rewards + self._process_tokens(batch).to(token_rewards.device)
        penalty = masked_mean(-alg.kl_coef * kl, mask)
        return token_rewards, {"kl": masked_mean(kl, mask), "kl_reward_mean": penalty}

    def filter_truncated(self, batch: Batch, loss_mask: Tensor) -> tuple[Tensor, dict[str, float]]:
        """DAPO's overlong filter (``algorithm.overlong.filter``): rows of truncated samples
        (``status == "truncated"``, or a last turn cut at the length limit) leave the loss."""
        if not self.alg.overlong.filter:
            return loss_mask, {}
        truncated = torch.tensor([_is_truncated(t) for t in batch.trajectories])
        filtered = overlong_filter(loss_mask, truncated)
        dropped = truncated & (loss_mask.sum(dim=1) > 0)
        return filtered, {"overlong_filtered": float(dropped.sum())}

    def advantages(
        self, batch: Batch, rewards: Tensor, values: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """(advantages [B, T], loss_mask [B, T], value targets [B, T] or None).

        `values` are the critic's at the start of the step (when it needs one). Branch
        trees attribute sequence advantages to tokens; their loss mask can change."""
        alg, mask = self.alg, batch.loss_mask
        self._adapt_kl()
        is_tree = any(t.parent_id is not None for t in batch.trajectories)
        process = self.process_rewards(batch)
        seq_rewards = rewards if rewards.dim() == 1 else batch.rewards
        if process is not None:
            seq_rewards = seq_rewards + process.sum(dim=1)
        self._step_inputs = {
            "group_ids": batch.group_index,
            "rewards": seq_rewards,
            "lengths": batch.loss_mask.sum(dim=1),
        }
        if rewards.dim() == 1 and not self.per_turn:
            if ADVANTAGES.takes_token_rewards(alg.advantage) and not self.needs_critic:
                # REINFORCE++ whitens its returns over tokens, outcome-only or not
                rewards = self.token_rewards(batch, rewards)
            elif self.needs_critic and process is not None:
                rewards = self.token_rewards(batch, rewards)
            elif process is not None:  # a sequence-level estimator: the episode's return
                rewards = seq_rewards
        inputs: dict[str, Any] = {"valid": batch.valid}
        if self.needs_critic:
            inputs.update(values=values, mask=mask, gamma=alg.gamma, lam=alg.lam)
        elif rewards.dim() == 2:  # per-token rewards (kl_in_reward, step rewards)
            inputs.update(mask=mask, gamma=alg.gamma)
        for key in self.advantage_inputs:
            if key not in inputs:
                inputs[key] = self._advantage_input(key, batch)
        adv, returns = estimate_advantages(
            alg.advantage, rewards, batch.group_index, **inputs, **self.advantage_options
        )
        if is_tree:
            if adv.dim() != 1:
                raise ConfigError(
                    f"algorithm.advantage={alg.advantage} gives per-token advantages, which "
                    "branch trees (rollout.branching.enabled=true) cannot attribute: use a "
                    "group estimator such as grpo"
                )
            trajs = batch.trajectories
            parent, branch_pos = tree_from_ids(
                [t.traj_id for t in trajs],
                [t.parent_id for t in trajs],
                [t.branch_position for t in trajs],
            )
            # a registered attribution returns (advantages, loss_mask): a tuple will do
            tree_adv, tree_mask = tree_advantages(
                self.attribution, adv, parent, branch_pos, mask, batch.input_ids
            )
            return tree_adv, tree_mask.to(mask.dtype), returns
        if self.needs_critic:
            return adv, mask, returns
        return (adv[:, None] if adv.dim() == 1 else adv) * mask, mask, returns

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must carry for a resumed run to continue this objective exactly:
        the adaptive-KL beta and the KL seen since it was last adapted ({} for the rest)."""
        if self.adaptive_kl is None:
            return {}
        seen = self._seen_kl()  # a step not ended by :meth:`end_step`: this process's KL
        pending = float(seen[0] / seen[1]) if seen[1] > 0 else self._last_kl
        return {"adaptive_kl": {"beta": self.adaptive_kl.beta, "pending_kl": pending}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`. The checkpoint's adapted beta replaces the configured
        ``kl_beta`` (which only starts a run); a checkpoint without it (saved before beta was
        checkpointed) keeps the configured one."""
        saved = state.get("adaptive_kl")
        if self.adaptive_kl is None or not saved:
            return
        self.adaptive_kl.beta = float(saved["beta"])
        self.loss_options["kl_beta"] = self.adaptive_kl.beta
        pending = saved.get("pending_kl")
        self._kl_seen = []
        self._last_kl = None if pending is None else float(pending)

    def end_step(self, sum_over_ranks: Callable[[Tensor], Tensor] | None = None) -> None:
        """Close a training step for adaptive KL: the mean KL(pi_old || pi_theta) of its
        micro-batches, over every rank when `sum_over_ranks` sums a tensor across the
        learner's ranks (a collective: every rank calls it at the same point), so all ranks
        adapt the same beta. One host read a step."""
        if self.adaptive_kl is None:
            return
        seen = self._seen_kl()
        if sum_over_ranks is not None:
            seen = sum_over_ranks(seen)
        self._kl_seen = []
        if float(seen[1]) > 0:
            self._last_kl = float(seen[0] / seen[1])

    def _seen_kl(self) -> Tensor:
        """[sum, count] (float64, host) of the KL of the micro-batches since the last
        :meth:`end_step`."""
        seen = torch.zeros(2, dtype=torch.float64)
        if self._kl_seen:
            seen[0] = float(torch.stack([k.detach().double() for k in self._kl_seen]).sum())
            seen[1] = len(self._kl_seen)
        return seen

    def _adapt_kl(self) -> None:
        """Adaptive-KL PPO: the last step's mean KL(pi_old || pi_theta) sets this step's beta."""
        if self.adaptive_kl is None:
            return
        if self._kl_seen:  # used without a learner calling end_step: this process's KL
            self.end_step()
        if self._last_kl is not None:
            self.adaptive_kl.update(self._last_kl)
        self._last_kl = None
        self.loss_options["kl_beta"] = self.adaptive_kl.beta

    def _advantage_input(self, key: str, batch: Batch) -> Any:
        """The batch input `key` of :data:`ADVANTAGE_INPUTS` (mask and gamma aside)."""
        if key == "mask":
            return batch.loss_mask
        if key == "gamma":
            return self.alg.gamma
        if key == "tree_ids":
            trajs = batch.trajectories
            parent, _ = tree_from_ids(
                [t.traj_id for t in trajs], [t.parent_id for t in trajs], [None] * len(trajs)
            )
            return tree_roots(parent).to(batch.group_index.device)
        if key == "turn_index":
            return turn_index(batch.turn_ends, batch.loss_mask)
        if key == "turn_rewards":
            process = self.process_rewards(batch)
            return torch.zeros_like(batch.turn_rewards) if process is None else process
        if key == "turn_states":
            return batch.turn_states
        if key == "response_lengths":
            return batch.response_lengths
        return getattr(batch, key)  # turn_ends, turn_mask

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
        declares (:data:`LOSS_INPUTS`)."""
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
                declared[key] = self._step_inputs[key][rows.cpu()].to(logprobs.device)
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
        if self.adaptive_kl is not None and "kl_old_theta" in pg_metrics:
            self._kl_seen.append(torch.as_tensor(pg_metrics["kl_old_theta"]).detach())
        metrics = {f"pg/{k}": v for k, v in pg_metrics.items() if k != "pg_loss"}
        loss = pg
        metrics["loss/pg"] = unscaled(pg, mask, denominator, self._unit_agg)
        if entropy is not None:
            # through the graph only when it is in the loss
            ent = entropy if alg.entropy_coef else entropy.detach()
            ent_term = aggregate(alg.agg, ent, mask, **agg_kw)
            metrics["loss/entropy"] = unscaled(ent_term, mask, denominator, self._unit_agg)
            metrics["entropy"] = masked_mean(entropy, mask)
            if alg.entropy_coef:
                loss = loss - alg.entropy_coef * ent_term
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


def _lookup(registry: Any, name: str, field: str) -> Any:
    """``registry.get(name)``, its unknown-name error prefixed with the config field."""
    try:
        return registry.get(name)
    except UnknownNameError as e:
        raise UnknownNameError(f"{field}: {e.args[0]}") from None


def turn_index(turn_ends: Tensor, loss_mask: Tensor) -> Tensor:
    """The assistant turn of each trained token ``[B, T]`` (-1 on untrained positions):
    turn k holds the trained tokens after turn k-1's last token up to its own."""
    T = loss_mask.shape[1]
    ends = torch.where(turn_ends >= 0, turn_ends, torch.full_like(turn_ends, T))
    pos = torch.arange(T).expand(loss_mask.shape[0], T).contiguous()
    idx = torch.searchsorted(ends.contiguous(), pos)
    return torch.where(loss_mask > 0, idx, torch.full_like(idx, -1))


def _is_truncated(traj: Trajectory) -> bool:
    """A limit ended the episode, or its last turn was cut at max_new_tokens."""
    return traj.status == "truncated" or bool(
        traj.turns and traj.turns[-1].finish_reason == "length"
    )
