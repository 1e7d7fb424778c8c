"""A user's aggregation, tree attribution and group-coupled policy loss, registered outside
agentrl and selected by name from YAML in test_step_credit.py."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from agentrl.algos import register_aggregation, register_policy_loss, register_tree_attribution

CALLS: dict[str, int] = {"agg": 0, "attribution": 0, "loss": 0}
SEEN_GROUPS: list[list[int]] = []


# the per-row sum of the token losses, averaged over rows (a "sequence" unit)
@register_aggregation("user-seq-sum")
def seq_sum(loss: Tensor, mask: Tensor, *, denominator: float | None = None, **_: Any) -> Tensor:
    CALLS["agg"] += 1
    m = mask.to(loss.dtype)
    rows = (m.sum(dim=-1) > 0).sum().clamp(min=1)
    return (loss * m).sum() / (denominator if denominator is not None else rows)


# every row trains its own tokens with its advantage, shared prefixes not trained at all
@register_tree_attribution("own-tokens-only")
def own_tokens_only(advantages: Tensor, owner: Tensor, loss_mask: Tensor) -> tuple[Tensor, Tensor]:
    CALLS["attribution"] += 1
    rows = torch.arange(owner.shape[0])[:, None]
    mine = (owner == rows).to(loss_mask.dtype) * loss_mask
    adv = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(loss_mask)
    return adv * mine, mine


# a loss that needs every row of its group: the advantage re-centred on the group mean
@register_policy_loss("group_centred", couples_group=True)
def group_centred(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *, group_ids: Tensor
) -> tuple[Tensor, dict[str, Any]]:
    CALLS["loss"] += 1
    SEEN_GROUPS.append(group_ids.tolist())
    ratio = torch.exp(logprobs - old_logprobs)
    return -advantages * ratio, {}
