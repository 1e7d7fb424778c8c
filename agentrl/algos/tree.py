"""Advantage attribution for branch trees (ARPO, Dong et al. 2025, arXiv 2507.19849).

Input format (rows of one padded batch, ``[B]`` unless noted):

* ``advantages`` -- each row's outcome advantage (a row is one root-to-leaf path), ``[B]``,
  or per token ``[B, T]`` (then ``hard`` averages the rows' values at each shared token);
* ``parent``     -- long, the batch row this row branched from, ``-1`` for a root;
* ``branch_pos`` -- long, index in ``input_ids`` where the row's own tokens start; tokens
  ``[0, branch_pos)`` are identical to the parent's (ignored for roots);
* ``loss_mask [B, T]`` -- 1 on trained tokens.

A token ``(row, t)`` belongs to the top-most ancestor that holds the same token: climb
while ``t < branch_pos[row]``. Rows with the same owner at ``t`` share that token.

* ``soft``: every row trains its whole sequence with its own advantage (shared prefixes
  are trained once per row, as the ARPO reference code does).
* ``hard``: each shared token is trained once, by one of the rows that share it, with the
  mean advantage of the rows below it (those with a nonzero loss mask there). The returned
  ``loss_mask`` keeps the token in one row only, so use ``agg="token-mean"`` to count each
  token exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from agentrl.algos.registry import TREE_ATTRIBUTIONS, register_tree_attribution


class TreeAttribution(NamedTuple):
    advantages: Tensor  # [B, T], 0 where loss_mask is 0
    loss_mask: Tensor  # [B, T]


def tree_owner(parent: Tensor, branch_pos: Tensor, T: int) -> Tensor:
    """``owner [B, T]``: the top-most row holding token ``t`` of row ``b`` (vectorised per depth)."""
    B = parent.shape[0]
    if parent.shape != (B,) or branch_pos.shape != (B,):
        raise ValueError(
            f"parent and branch_pos must be 1-D [B] (got {tuple(parent.shape)}, "
            f"{tuple(branch_pos.shape)})"
        )
    parent = parent.to(torch.long)
    branch_pos = branch_pos.to(torch.long)
    rows = torch.arange(B, device=parent.device)
    bad = (parent < -1) | (parent >= B) | (parent == rows)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(
            f"parent[{i}] = {int(parent[i])} is not a row index in [-1, {B}) other than itself; "
            "use -1 for roots"
        )
    child = parent >= 0
    bad_pos = child & ((branch_pos < 0) | (branch_pos > T))
    if bool(bad_pos.any()):
        i = int(bad_pos.nonzero()[0])
        raise ValueError(f"branch_pos[{i}] = {int(branch_pos[i])} must be in [0, T={T}]")
    t = torch.arange(T, device=parent.device).expand(B, T)
    owner = rows[:, None].expand(B, T).clone()
    for _ in range(B + 1):
        move = (parent[owner] >= 0) & (t < branch_pos[owner])
        if not bool(move.any()):
            return owner
        owner = torch.where(move, parent[owner], owner)
    raise ValueError("parent links form a cycle; every chain must end at a root (-1)")


def _per_token(advantages: Tensor, shape: torch.Size) -> Tensor:
    adv = advantages.to(torch.float32)
    return adv[:, None].expand(shape) if adv.dim() == 1 else adv


@register_tree_attribution("soft")
def soft(advantages: Tensor, owner: Tensor, loss_mask: Tensor) -> TreeAttribution:
    adv = _per_token(advantages, owner.shape)
    on = loss_mask > 0
    return TreeAttribution(torch.where(on, adv, torch.zeros_like(adv)), loss_mask.clone())


@register_tree_attribution("hard")
def hard(advantages: Tensor, owner: Tensor, loss_mask: Tensor) -> TreeAttribution:
    B, T = owner.shape
    rows = torch.arange(B, device=owner.device)[:, None].expand(B, T)
    key = owner * T + torch.arange(T, device=owner.device)
    on = loss_mask > 0
    k, r = key[on], rows[on]
    a = _per_token(advantages, owner.shape)[on]
    total = torch.zeros(B * T, device=owner.device).index_add_(0, k, a)
    count = torch.zeros(B * T, device=owner.device).index_add_(0, k, torch.ones_like(a))
    rep = torch.full((B * T,), B, device=owner.device, dtype=torch.long)
    rep = rep.scatter_reduce(0, k, r, reduce="amin")
    mean = total[key] / count[key].clamp(min=1.0)
    keep = on & (rows == rep[key])
    return TreeAttribution(
        torch.where(on, mean, torch.zeros_like(mean)), loss_mask * keep.to(loss_mask.dtype)
    )


def tree_advantages(
    name: str,
    advantages: Tensor,
    parent: Tensor,
    branch_pos: Tensor,
    loss_mask: Tensor,
    input_ids: Tensor | None = None,
) -> TreeAttribution:
    """Per-token advantages and loss mask for a batch of branch trees (see module doc).

    When ``input_ids [B, T]`` is given, every shared prefix is checked to be identical.
    """
    B, T = loss_mask.shape
    if advantages.shape not in ((B,), (B, T)):
        raise ValueError(
            f"advantages must be [B={B}] or [B, T]={(B, T)} (got {tuple(advantages.shape)})"
        )
    fn = TREE_ATTRIBUTIONS.get(name)
    owner = tree_owner(parent, branch_pos, T)
    if input_ids is not None:
        rows = torch.arange(B, device=owner.device)[:, None]
        same = input_ids[owner, torch.arange(T, device=owner.device)]
        bad = (same != input_ids) & (owner != rows)
        if bool(bad.any()):
            b, t = (int(x) for x in bad.nonzero()[0])
            raise ValueError(
                f"row {b} claims token {t} from row {int(owner[b, t])} (branch_pos "
                f"{int(branch_pos[b])}) but the ids differ; fix parent/branch_pos"
            )
    return fn(advantages, owner, loss_mask)


def tree_from_ids(
    traj_ids: Sequence[str],
    parent_ids: Sequence[str | None],
    branch_positions: Sequence[int | None],
) -> tuple[Tensor, Tensor]:
    """``(parent, branch_pos)`` tensors from trajectory ids (``Trajectory.traj_id``,
    ``parent_id``, ``branch_position``); a parent absent from the batch makes a root."""
    index = {tid: i for i, tid in enumerate(traj_ids)}
    parent = [index.get(p, -1) if p is not None else -1 for p in parent_ids]
    pos = [
        (bp if bp is not None else 0) if parent[i] >= 0 else 0
        for i, bp in enumerate(branch_positions)
    ]
    return torch.tensor(parent, dtype=torch.long), torch.tensor(pos, dtype=torch.long)
