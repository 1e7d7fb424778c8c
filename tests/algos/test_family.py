"""REINFORCE mean baseline, Lite PPO, GMPO and GVPO against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algos import compute_advantages, policy_loss
from agentrl.run.settings import resolve


def test_reinforce_mean_baseline():
    # mean of the valid rows [1, 0, 0.5] is 0.5; the invalid row gets 0
    adv = compute_advantages(
        "reinforce_mean",
        torch.tensor([1.0, 0.0, 0.5, 9.0]),
        torch.tensor([0, 0, 1, 1]),
        valid=torch.tensor([1.0, 1.0, 1.0, 0.0]),
    )
    assert adv.tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0])


def test_lite_ppo_group_mean_batch_std():
    # groups {1, 0} and {1, 1}: centred [.5, -.5, 0, 0]; batch std of [1, 0, 1, 1] = 0.5
    adv = compute_advantages(
        "lite_ppo", torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1])
    )
    assert adv.tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0], abs=1e-5)


def test_gmpo_geometric_mean_with_log_space_clip():
    # row 0: A = 1, log ratios [0.1, 0.6] -> clip on the upper side: [0.1, 0.4] ->
    #   loss = -1 * exp(0.25); row 1: A = -2, log ratios [-0.6, 0.2] -> max(l, clip):
    #   [-0.4, 0.2] -> loss = 2 * exp(-0.1)
    old = torch.zeros(2, 2)
    lp = torch.tensor([[0.1, 0.6], [-0.6, 0.2]])
    adv = torch.tensor([1.0, -2.0])
    mask = torch.ones(2, 2)
    loss, _ = policy_loss("gmpo", lp, old, adv, mask, agg="seq-mean-token-mean", log_clip=0.4)
    want = (-math.exp(0.25) + 2 * math.exp(-0.1)) / 2
    assert float(loss) == pytest.approx(want, abs=1e-6)


def test_gvpo_group_centred_regression():
    # one group of two, beta 0.5: s = sum(lp - ref) = [0.3, -0.1] -> centred [0.2, -0.2];
    # rewards [1, 0] -> centred [0.5, -0.5]; residual [0.5 - 0.1, -0.5 + 0.1] = [0.4, -0.4]
    # loss per row 0.5 * 0.16 = 0.08; seq-mean-token-mean -> 0.08
    lp = torch.tensor([[0.2, 0.1], [-0.1, 0.0]], requires_grad=True)
    ref = torch.zeros(2, 2)
    loss, metrics = policy_loss(
        "gvpo",
        lp,
        lp.detach(),
        torch.zeros(2),
        torch.ones(2, 2),
        agg="seq-mean-token-mean",
        ref_logprobs=ref,
        group_ids=torch.tensor([3, 3]),
        rewards=torch.tensor([1.0, 0.0]),
        beta=0.5,
    )
    assert float(loss.detach()) == pytest.approx(0.08, abs=1e-6)
    assert float(metrics["gvpo_residual"]) == pytest.approx(0.4, abs=1e-6)
    loss.backward()
    # L = 1/2 sum_i 0.5 r_i^2, dr_0/ds_0 = -beta/2, dr_1/ds_0 = beta/2:
    # dL/ds_0 = 1/2 (0.4 * -0.25 + -0.4 * 0.25) = -0.1, on every token of row 0
    assert lp.grad[0].tolist() == pytest.approx([-0.1, -0.1], abs=1e-6)


def test_grpo_lambda_shapes_only_the_most_accurate_groups():
    # group 0 all correct, lengths 10/20/30 -> lambda .5/0/-.5 -> [1.5, 1, .5] -> [1, 0, -1]
    # group 1 (accuracy 1/3, not in the top half) keeps GRPO on [1, 0, 0]
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    lengths = torch.tensor([10, 20, 30, 10, 20, 30])
    adv = compute_advantages(
        "grpo_lambda", rewards, groups, response_lengths=lengths, top_fraction=0.5
    )
    s = (1 / 3) ** 0.5
    want = [1.0, 0.0, -1.0, (2 / 3) / s, -(1 / 3) / s, -(1 / 3) / s]
    assert adv.tolist() == pytest.approx(want, abs=1e-4)
    # top_fraction 1: group 1 is shaped too: [1.5, 0, -0.5] (a wrong answer only loses)
    both = compute_advantages(
        "grpo_lambda", rewards, groups, response_lengths=lengths, top_fraction=1.0
    )
    shaped = torch.tensor([1.5, 0.0, -0.5])
    ref = (shaped - shaped.mean()) / (shaped.std() + 1e-6)
    assert both[3:].tolist() == pytest.approx(ref.tolist(), abs=1e-4)


def test_ppo_adaptive_kl_loss_and_beta_schedule():
    from agentrl.algos.family import AdaptiveKL

    # one token, log ratio log 2: r = 2, A = 1, KL = 2 - 1 - log 2 = 0.30685; beta 0.5
    lp, old = torch.tensor([[math.log(2.0)]]), torch.zeros(1, 1)
    loss, m = policy_loss(
        "ppo_adaptive_kl", lp, old, torch.tensor([1.0]), torch.ones(1, 1), kl_beta=0.5
    )
    kl = 1.0 - math.log(2.0)
    assert float(loss) == pytest.approx(-2.0 + 0.5 * kl, abs=1e-6)
    assert float(m["kl_old_theta"]) == pytest.approx(kl, abs=1e-6)
    ctl = AdaptiveKL(beta=1.0, target=0.01)
    assert ctl.update(0.02) == 2.0  # > 1.5 * target: doubled
    assert ctl.update(0.01) == 2.0  # within the band: kept
    assert ctl.update(0.001) == 1.0  # < target / 1.5: halved


def test_gmpo_clip_option_does_not_reach_the_advantage_estimator():
    # algorithm.options go to every function naming them: GMPO's clip must not be named like
    # grpo's std epsilon `eps`, or {eps: 0.4} would rescale every GRPO advantage
    from agentrl.config import config_from_dict
    from agentrl.learner.objective import Objective

    cfg = config_from_dict(
        {
            "algorithm": {
                "advantage": "grpo",
                "policy_loss": "gmpo",
                "agg": "seq-mean-token-mean",
                "options": {"log_clip": 0.3},
            }
        }
    )
    obj = Objective(resolve(cfg).objective.algorithm, attribution="soft", norm_length=8)
    assert obj.loss_options["log_clip"] == 0.3
    assert "log_clip" not in obj.advantage_options and "eps" not in obj.advantage_options
