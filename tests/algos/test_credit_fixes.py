"""The approx_kl metric and REINFORCE++'s whitening, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algos import compute_advantages, policy_loss


def test_approx_kl_is_kl_of_old_against_theta_on_tokens_from_old():
    # the example: p_old = [.5, .2, .15, .1, .05], p_theta = [.3, .3, .2, .1, .1]
    p_old = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    p_theta = torch.tensor([0.3, 0.3, 0.2, 0.1, 0.1])
    true_kl = float((p_old * (p_old / p_theta).log()).sum())
    assert true_kl == pytest.approx(0.0965, abs=1e-4)
    # every token once, weighted by how often pi_old samples it: exact expectation
    counts = [10, 4, 3, 2, 1]
    old = torch.cat([torch.full((n,), math.log(p_old[i])) for i, n in enumerate(counts)])
    theta = torch.cat([torch.full((n,), math.log(p_theta[i])) for i, n in enumerate(counts)])
    _, metrics = policy_loss(
        "ppo", theta[None], old[None], torch.zeros(1, len(old)), torch.ones(1, len(old))
    )
    assert float(metrics["approx_kl"]) == pytest.approx(true_kl, abs=1e-5)


def test_approx_kl_is_never_negative():
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(4, 16, generator=g)
    old = -torch.rand(4, 16, generator=g)
    _, metrics = policy_loss("ppo", lp, old, torch.zeros(4, 16), torch.ones(4, 16))
    assert float(metrics["approx_kl"]) >= 0


def test_reinforce_pp_whitens_over_tokens_weighted_by_length():
    # rewards [1, 0], lengths 1 and 3: tokens [1, 0, 0, 0] -> mean .25, std .5 -> 1.5, -0.5
    rewards = torch.tensor([1.0, 0.0])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    groups = torch.tensor([0, 1])
    adv = compute_advantages("reinforce_pp", rewards, groups, mask=mask)
    assert adv.tolist() == pytest.approx([1.5, -0.5], abs=1e-5)
    # the per-token path agrees (gamma 1, outcome on the last token)
    token_rewards = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    tok = compute_advantages("reinforce_pp", token_rewards, groups, mask=mask, gamma=1.0)
    assert tok[0, 0] == pytest.approx(1.5, abs=1e-5) and tok[1].tolist() == pytest.approx(
        [-0.5] * 3, abs=1e-5
    )
    # baseline, one group: centred [.5, -.5] -> tokens [.5, -.5, -.5, -.5] -> 1.5, -0.5
    base = compute_advantages("reinforce_pp_baseline", rewards, torch.tensor([0, 0]), mask=mask)
    assert base.tolist() == pytest.approx([1.5, -0.5], abs=1e-5)
    # without a mask each row counts once (rewards [1, 0] -> +-0.707)
    per_row = compute_advantages("reinforce_pp", rewards, groups)
    assert per_row.tolist() == pytest.approx([0.7071, -0.7071], abs=1e-4)
