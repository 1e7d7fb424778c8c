"""From a batch's rewards to the advantages the updates train on (DESIGN.md §10, §14).

A batch carries the outcome of each row (``Batch.rewards``) and, per assistant turn, the
step and process rewards (``Batch.turn_rewards``), never one inside the other. What the
estimator gets follows from its registration, not from a tensor's shape:

- one that declares ``turn_rewards`` (GiGPO): the outcome ``[B]``, and the weighted turn
  rewards as an input, combined as its paper says;
- one registered with ``token_rewards`` or ``needs_critic`` (REINFORCE++, GAE): per-token
  rewards ``[B, T]``, the outcome on each row's last trained token and ``step_weight``
  times each turn's reward on that turn's last token (with ``algorithm.kl_in_reward``,
  minus the KL penalty on every token), with ``mask`` and ``gamma``;
- any other (GRPO, RLOO, ...): the return ``[B]``, outcome plus ``step_weight`` times the
  sum of the turn rewards (:meth:`Credit.sequence_returns`).

Besides the rewards, an estimator gets exactly the :class:`~agentrl.algos.AdvantageInputs`
fields it declared, built here by name (:meth:`Credit.input`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from agentrl.algos import (
    kl_divergence,
    kl_penalized_rewards,
    overlong_filter,
    overlong_penalty,
    place_outcome_rewards,
    tree_advantages,
    tree_from_ids,
)
from agentrl.algos.registry import ADVANTAGES
from agentrl.algos.stats import masked_mean
from agentrl.algos.tree_grpo import tree_roots
from agentrl.errors import ConfigError
from agentrl.learner.metrics import valid_mean
from agentrl.types import Batch, Trajectory


class Credit:
    """The advantage estimator ``alg.advantage`` fed as its registration declares."""

    def __init__(
        self, alg: Any, *, attribution: str, step_weight: float, options: dict[str, Any]
    ) -> None:
        self.alg = alg
        self.attribution = attribution
        self.step_weight = float(step_weight)
        self.options = options  # algorithm.options routed to the estimator
        name = alg.advantage
        self.fn = ADVANTAGES.get(name)
        self.needs_critic = ADVANTAGES.needs_critic(name)
        self.token_level = ADVANTAGES.takes_token_rewards(name)
        self.inputs = ADVANTAGES.inputs(name)
        self.per_turn = "turn_rewards" in self.inputs  # it credits the turns itself
        self.selects_rows = ADVANTAGES.selects_rows(name)  # rejection sampling (RAFT)
        # the step's per-row inputs a policy loss may read (LossInputs): set by advantages()
        self.step_inputs: dict[str, Tensor] = {}

    # --- rewards ---------------------------------------------------------------------

    def process_rewards(self, batch: Batch) -> Tensor | None:
        """Per-turn step and process rewards times ``reward.step_weight`` ``[B, K]``; None
        when the batch has none (or the weight is 0)."""
        if self.step_weight == 0 or batch.turn_rewards is None:
            return None
        if not bool((batch.turn_rewards != 0).any()):
            return None
        return batch.turn_rewards * self.step_weight * batch.valid[:, None]

    def shaped_outcomes(self, batch: Batch) -> tuple[Tensor, dict[str, float]]:
        """The outcomes advantages are computed from ``[B]``: DAPO's overlong shaping when
        it is on."""
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

    def sequence_returns(self, batch: Batch, outcomes: Tensor) -> Tensor:
        """Each row's return ``[B]``: its outcome plus its weighted step rewards, what a
        sequence-level estimator trains on."""
        process = self.process_rewards(batch)
        return outcomes if process is None else outcomes + process.sum(dim=1)

    def token_rewards(self, batch: Batch, outcomes: Tensor) -> Tensor:
        """Per-token rewards ``[B, T]``: the outcome on each row's last trained token plus
        the weighted step rewards on the last token of their turn."""
        return place_outcome_rewards(outcomes, batch.loss_mask) + self._turn_tokens(batch)

    def kl_rewards(
        self, batch: Batch, outcomes: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor
    ) -> tuple[Tensor, dict[str, float]]:
        """Per-token rewards ``[B, T]`` for ``algorithm.kl_in_reward``: :meth:`token_rewards`
        minus ``kl_coef`` times the KL estimate of pi_old against the reference policy on
        every trained token."""
        alg = self.alg
        assert alg.kl is not None
        mask = batch.loss_mask * batch.valid[:, None]
        kl = kl_divergence(alg.kl, old_logprobs, ref_logprobs) * mask
        token_rewards = kl_penalized_rewards(outcomes, kl, mask, alg.kl_coef)
        token_rewards = token_rewards + self._turn_tokens(batch).to(token_rewards.device)
        penalty = masked_mean(-alg.kl_coef * kl, mask)
        return token_rewards, {"kl": masked_mean(kl, mask), "kl_reward_mean": penalty}

    def _turn_tokens(self, batch: Batch) -> Tensor:
        """The weighted turn rewards scattered onto each turn's last token ``[B, T]``."""
        out = torch.zeros(batch.loss_mask.shape, dtype=torch.float32)
        process = self.process_rewards(batch)
        if process is None:
            return out
        ends = batch.turn_ends
        has = ends >= 0
        rows = torch.arange(ends.shape[0])[:, None].expand_as(ends)
        out.index_put_((rows[has], ends[has]), process[has].float(), accumulate=True)
        return out * (batch.loss_mask > 0)

    # --- advantages ------------------------------------------------------------------

    def advantages(
        self,
        batch: Batch,
        outcomes: Tensor,
        values: Tensor | None,
        token_rewards: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """(advantages [B, T], loss_mask [B, T], value targets [B, T] or None).

        `outcomes` ``[B]``; `token_rewards` ``[B, T]``: the KL-penalised per-token rewards
        of ``algorithm.kl_in_reward`` (:meth:`kl_rewards`), else None. `values` are the
        critic's at the start of the step (when it needs one). Branch trees attribute
        sequence advantages to tokens; their loss mask can change."""
        if outcomes.dim() != 1:
            raise ValueError(f"outcomes must be [B] (got shape {tuple(outcomes.shape)})")
        alg, mask = self.alg, batch.loss_mask
        returns_seq = self.sequence_returns(batch, outcomes)
        self.step_inputs = {
            "group_ids": batch.group_index,
            "rewards": returns_seq,
            "lengths": batch.loss_mask.sum(dim=1),
        }
        per_token = token_rewards is not None or (
            not self.per_turn
            and (
                (self.token_level and not self.needs_critic)  # REINFORCE++ whitens its returns
                or (self.needs_critic and self.process_rewards(batch) is not None)
            )
        )
        if token_rewards is not None:
            rewards = token_rewards
        elif per_token:
            rewards = self.token_rewards(batch, outcomes)
        elif self.per_turn or self.needs_critic:
            rewards = outcomes
        else:
            rewards = returns_seq
        kwargs: dict[str, Any] = {"valid": batch.valid}
        if self.needs_critic:
            kwargs.update(values=values, mask=mask, gamma=alg.gamma, lam=alg.lam)
        elif per_token:
            kwargs.update(mask=mask, gamma=alg.gamma)
        for key in self.inputs:
            if key not in kwargs:
                kwargs[key] = self.input(key, batch)
        out = self.fn(rewards, batch.group_index, **kwargs, **self.options)
        adv, returns = out if self.needs_critic else (out, None)
        if self.selects_rows:  # the rejected rows leave the loss and its mean
            kept = (adv != 0) if adv.dim() == 1 else (adv != 0).any(dim=1)
            mask = mask * kept[:, None].to(mask.dtype)
        if any(t.parent_id is not None for t in batch.trajectories):
            tree_adv, tree_mask, returns = self._attribute_to_tree(batch, adv, returns)
            if self.selects_rows:
                tree_mask = tree_mask * kept[:, None].to(tree_mask.dtype)
                tree_adv = tree_adv * tree_mask
            return tree_adv, tree_mask, returns
        if self.needs_critic:
            return adv, mask, returns
        return (adv[:, None] if adv.dim() == 1 else adv) * mask, mask, returns

    def _attribute_to_tree(
        self, batch: Batch, adv: Tensor, returns: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        if adv.dim() != 1:
            raise ConfigError(
                f"algorithm.advantage={self.alg.advantage} gives per-token advantages, which "
                "branch trees (rollout.branching.enabled=true) cannot attribute: use a "
                "group estimator such as grpo"
            )
        trajs, mask = batch.trajectories, batch.loss_mask
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

    def input(self, key: str, batch: Batch) -> Any:
        """The :class:`~agentrl.algos.AdvantageInputs` field `key` of `batch`."""
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
        if hasattr(batch, key):  # a field named as the Batch's own (turn_ends, turn_mask, ...)
            return getattr(batch, key)
        raise ValueError(
            f"AdvantageInputs field {key!r} is neither a Batch field nor built in Credit.input"
        )

    # --- which rows train ------------------------------------------------------------

    def filter_truncated(self, batch: Batch, loss_mask: Tensor) -> tuple[Tensor, dict[str, float]]:
        """DAPO's overlong filter (``algorithm.overlong.filter``): rows of truncated samples
        (``status == "truncated"``, or a last turn cut at the length limit) leave the loss."""
        if not self.alg.overlong.filter:
            return loss_mask, {}
        truncated = torch.tensor([_is_truncated(t) for t in batch.trajectories])
        filtered = overlong_filter(loss_mask, truncated)
        dropped = truncated & (loss_mask.sum(dim=1) > 0)
        return filtered, {"overlong_filtered": float(dropped.sum())}


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
