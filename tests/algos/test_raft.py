"""RAFT: the kept samples and the reinforce loss, each by hand (the learner's side:
tests/learner/test_raft.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentrl.algos import ADVANTAGES, compute_advantages, policy_loss


def test_raft_keeps_each_groups_best_samples() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.3, 0.7, 0.7, 0.2, 0.0, 0.0, 0.9, 0.5])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3])
    valid = torch.ones(12)
    valid[10] = 0  # an infra error: never kept, even with the best reward
    adv = compute_advantages("raft", rewards, groups, valid=valid)
    # group 0: both 1s; group 1: both 0.7s; group 2: all fail, nothing; group 3: the 0.5
    assert adv.tolist() == [1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 1]
    strict = compute_advantages("raft", rewards, groups, valid=valid, min_reward=0.6)
    assert strict.tolist() == [1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0]
    assert ADVANTAGES.selects_rows("raft") and not ADVANTAGES.selects_rows("grpo")


def test_reinforce_loss_is_minus_advantage_times_log_prob() -> None:
    lp = np.array([[-0.5, -2.0], [-1.0, -0.1]])
    adv = np.array([1.0, 0.0])
    lp_t = torch.tensor(lp, requires_grad=True)
    loss, m = policy_loss(
        "reinforce", lp_t, lp_t.detach() + 0.3, torch.tensor(adv), torch.ones(2, 2)
    )
    loss.backward()
    assert float(loss.detach()) == pytest.approx((0.5 + 2.0) / 4)  # token-mean over 4 tokens
    assert np.allclose(lp_t.grad.numpy(), [[-0.25, -0.25], [0.0, 0.0]])  # no ratio: old unused
    assert float(m["nll"]) == pytest.approx(1.25)
