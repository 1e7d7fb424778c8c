"""Tree-GRPO's tree advantage: hand-computed values, the GRPO limit, the registry."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algos import ADVANTAGES, compute_advantages, tree_grpo
from agentrl.algos.tree_grpo import tree_roots


def test_tree_roots_follow_chains() -> None:
    parent = torch.tensor([-1, 0, 1, 2, -1, 4, 0])
    assert tree_roots(parent).tolist() == [0, 0, 0, 0, 4, 4, 0]
    with pytest.raises(ValueError, match="cycle"):
        tree_roots(torch.tensor([1, 0]))


def test_hand_computed_intra_plus_inter() -> None:
    # one task, two trees: rows 0 <- 1 and 2 <- 3
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    groups = torch.zeros(4, dtype=torch.long)
    trees = torch.tensor([0, 0, 2, 2])
    adv = compute_advantages("tree_grpo", rewards, groups, tree_ids=trees)
    # inter: mean 0.75, unbiased std 0.5; intra tree 0: mean 0.5, std sqrt(0.5); tree 2: 0
    s = math.sqrt(0.5)
    expected = [0.5 / s + 0.5, -0.5 / s - 1.5, 0.5, 0.5]
    assert adv.tolist() == pytest.approx(expected, abs=1e-5)


def test_without_trees_it_is_grpo_and_invalid_rows_get_zero() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    grpo = compute_advantages("grpo", rewards, groups)
    assert torch.allclose(tree_grpo(rewards, groups), grpo)
    singletons = torch.arange(6)  # every row its own tree: no intra-tree term
    assert torch.allclose(tree_grpo(rewards, groups, tree_ids=singletons), grpo)
    valid = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    adv = tree_grpo(rewards, groups, valid=valid, tree_ids=torch.tensor([0, 0, 0, 3, 3, 5]))
    assert adv[2] == 0.0


def test_registered_without_critic_and_checks_shape() -> None:
    assert "tree_grpo" in ADVANTAGES and not ADVANTAGES.needs_critic("tree_grpo")
    with pytest.raises(ValueError, match="one entry per row"):
        tree_grpo(torch.ones(3), torch.zeros(3, dtype=torch.long), tree_ids=torch.zeros(2))
