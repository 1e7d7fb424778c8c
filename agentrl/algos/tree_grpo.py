"""Tree-GRPO's tree advantage (Ji et al. 2025, "Tree Search for LLM Agent Reinforcement
Learning", arXiv 2509.21240).

A task's samples form several trees (ARPO: each of the N initial samples is the root of
one, its branches hang below it). Every leaf path ``i`` gets two group-relative terms:

* intra-tree: its reward normalised among the paths of its own tree -- paths that share a
  prefix and differ after a branch point, so the term credits the steps after the fork;
* inter-tree: its reward normalised among all paths of the task (GRPO's group).

    A_i = (r_i - mean_tree(i)) / std_tree(i) + (r_i - mean_group(i)) / std_group(i)

A tree with one path has no intra-tree term (0); without branches the estimator is GRPO.
The learner passes ``tree_ids`` (the batch row of each row's root, :func:`tree_roots`)
because the estimator names that parameter.
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentrl.algos.advantages import grpo
from agentrl.algos.registry import register_advantage


def tree_roots(parent: Tensor) -> Tensor:
    """``[B]`` the root row of every row, from ``parent [B]`` (-1 for a root), by pointer
    jumping (log-depth rounds)."""
    rows = torch.arange(parent.shape[0], device=parent.device)
    up = torch.where(parent >= 0, parent.to(torch.long), rows)
    for _ in range(max(int(parent.shape[0]).bit_length(), 1) + 1):
        nxt = up[up]
        if bool((nxt == up).all()):
            break
        up = nxt
    if bool((parent[up] < 0).all()):  # a cycle settles on rows that still have a parent
        return up
    raise ValueError("parent links form a cycle; every chain must end at a root (-1)")


# Tree-GRPO (arXiv 2509.21240): A = A_intra-tree + A_inter-tree
@register_advantage("tree_grpo", inputs=("tree_ids",))
def tree_grpo(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    valid: Tensor | None = None,
    tree_ids: Tensor | None = None,
    eps: float = 1e-6,
) -> Tensor:
    """``[B]`` advantages; ``tree_ids [B]`` names each row's tree (rows of different groups
    must not share one); None: every row is its own tree (plain GRPO)."""
    inter = grpo(rewards, group_ids, valid=valid, eps=eps)
    if tree_ids is None:
        return inter
    if tree_ids.shape != rewards.shape:
        raise ValueError(
            f"tree_ids must have one entry per row, shape {tuple(rewards.shape)} "
            f"(got {tuple(tree_ids.shape)})"
        )
    intra = grpo(rewards, tree_ids.to(group_ids.device), valid=valid, eps=eps)
    return intra + inter
