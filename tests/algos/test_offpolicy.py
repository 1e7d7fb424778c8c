"""Off-policy corrections on hand-computed values: cap modes, levels, rejection masks,
loglinear proximal log-probs; DAPO's overlong filter; REINFORCE++'s KL-in-reward."""

import math

import pytest
import torch

from agentrl.algos import (
    OFF_POLICY_MASKS,
    compute_advantages,
    correction_weights,
    importance_weights,
    kl_penalized_rewards,
    loglinear_proximal_logprobs,
    overlong_filter,
    policy_loss,
    register_off_policy_mask,
    rejection_mask,
)
from agentrl.errors import UnknownNameError

# three tokens whose pi_old / pi_behave are 5, 1 and 0.5
OLD = torch.log(torch.tensor([[0.5, 0.9, 0.3]], dtype=torch.float64))
BEHAVE = torch.log(torch.tensor([[0.1, 0.9, 0.6]], dtype=torch.float64))
ALL = torch.ones(1, 3)


def test_token_weights_truncate_or_mask_above_the_cap():
    w = importance_weights(OLD, BEHAVE, cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.0, 0.5]], dtype=torch.float64))
    w = importance_weights(OLD, BEHAVE, cap=2.0, mode="mask")
    torch.testing.assert_close(w, torch.tensor([[0.0, 1.0, 0.5]], dtype=torch.float64))


def test_sequence_weight_is_the_capped_product_over_trained_tokens():
    # 5 * 1 * 0.5 = 2.5 on every token of the row
    w = importance_weights(OLD, BEHAVE, ALL, cap=3.0, level="sequence")
    torch.testing.assert_close(w, torch.full((1, 3), 2.5, dtype=torch.float64))
    w = importance_weights(OLD, BEHAVE, ALL, cap=2.0, level="sequence")
    torch.testing.assert_close(w, torch.full((1, 3), 2.0, dtype=torch.float64))
    w = importance_weights(OLD, BEHAVE, ALL, cap=2.0, level="sequence", mode="mask")
    torch.testing.assert_close(w, torch.zeros(1, 3, dtype=torch.float64))
    # the untrained third token does not count: 5 * 1 = 5
    w = importance_weights(OLD, BEHAVE, torch.tensor([[1.0, 1, 0]]), cap=9.0, level="sequence")
    torch.testing.assert_close(w, torch.full((1, 3), 5.0, dtype=torch.float64))
    with pytest.raises(ValueError, match="mask="):
        importance_weights(OLD, BEHAVE, cap=2.0, level="sequence")


def test_icepop_token_mask_drops_tokens_outside_the_bounds():
    keep = rejection_mask("token", OLD, BEHAVE, ALL, low=0.4, high=2.0)
    torch.testing.assert_close(keep, torch.tensor([[0.0, 1.0, 1.0]], dtype=torch.float64))
    keep = rejection_mask("token", OLD, BEHAVE, ALL, low=0.6, high=6.0)
    torch.testing.assert_close(keep, torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64))


def test_geometric_mask_drops_whole_sequences_by_their_mean_log_ratio():
    # row 0: ratios 5, 1, 0.5 -> (2.5)^(1/3) = 1.357; row 1: ratios 4, 4 -> 4
    old = torch.log(torch.tensor([[0.5, 0.9, 0.3], [0.8, 0.4, 0.9]], dtype=torch.float64))
    behave = torch.log(torch.tensor([[0.1, 0.9, 0.6], [0.2, 0.1, 0.9]], dtype=torch.float64))
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    keep = rejection_mask("geometric", old, behave, mask, low=0.5, high=2.0)
    torch.testing.assert_close(keep, torch.tensor([[1.0, 1, 1], [0, 0, 0]], dtype=torch.float64))
    keep = rejection_mask("geometric", old, behave, mask, low=1.4, high=5.0)
    torch.testing.assert_close(keep, torch.tensor([[0.0, 0, 0], [1, 1, 1]], dtype=torch.float64))
    with pytest.raises(ValueError, match="low < high"):
        rejection_mask("geometric", old, behave, mask, low=2.0, high=2.0)


def test_mask_mode_is_the_token_mask_from_zero_to_the_cap():
    """The docs say so: is_mode=mask with cap c == truncate weights * token mask [0, c]."""
    torch.manual_seed(0)
    old, behave = torch.randn(3, 7), torch.randn(3, 7)
    mask = torch.ones(3, 7)
    a, _ = correction_weights(old, behave, mask, cap=1.5, mode="mask")
    b, _ = correction_weights(old, behave, mask, cap=1.5, reject="token", low=0.0, high=1.5)
    torch.testing.assert_close(a, b)


def test_icepop_through_policy_loss():
    # ratio pi_theta / pi_old = 1, A = 1: each token's loss is -w * keep; IcePop's
    # M(k) = k inside [0.5, 2] (cap above the bound) and 0 outside: (0 + 0.8 + 1) / 3
    prox = torch.tensor([[0.5, 0.4, 0.3]], dtype=torch.float64)
    beh = torch.tensor([[0.1, 0.5, 0.3]], dtype=torch.float64)
    loss, m = policy_loss(
        "ppo",
        prox.log().requires_grad_(),
        prox.log(),
        torch.ones(1),
        ALL,
        behavior_logprobs=beh.log(),
        correction="decoupled",
        is_cap=10.0,
        is_mask="token",
        is_mask_low=0.5,
        is_mask_high=2.0,
    )
    assert loss.item() == pytest.approx(-0.6)
    assert m["is_rejected_frac"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="tis"):
        policy_loss("ppo", prox.log(), prox.log(), torch.ones(1), ALL, is_mask="token")


def test_sequence_level_through_policy_loss():
    # one weight min(5 * 0.8 * 1, 3) = 3 for all three tokens
    prox = torch.tensor([[0.5, 0.4, 0.3]], dtype=torch.float64)
    beh = torch.tensor([[0.1, 0.5, 0.3]], dtype=torch.float64)
    loss, m = policy_loss(
        "ppo",
        prox.log(),
        prox.log(),
        torch.ones(1),
        ALL,
        behavior_logprobs=beh.log(),
        correction="tis",
        is_cap=3.0,
        is_level="sequence",
    )
    assert loss.item() == pytest.approx(-3.0)
    assert m["is_weight_mean"] == pytest.approx(3.0)
    assert m["is_capped_frac"] == pytest.approx(1.0)


def test_a_registered_mask_is_picked_by_name():
    @register_off_policy_mask("keep_first_test")
    def keep_first(log_ratio, mask, *, low, high):
        out = torch.zeros_like(log_ratio)
        out[:, 0] = 1
        return out

    try:
        keep = rejection_mask("keep_first_test", OLD, BEHAVE, ALL, low=0.0, high=1.0)
        assert keep.tolist() == [[1.0, 0.0, 0.0]]
        with pytest.raises(UnknownNameError, match="geometric"):
            rejection_mask("geometrik", OLD, BEHAVE, ALL, low=0.0, high=1.0)
    finally:
        OFF_POLICY_MASKS._fns.pop("keep_first_test")


def test_loglinear_interpolates_by_version():
    behave = torch.tensor([[-2.0, -1.0, -3.0]])
    current = torch.tensor([[-1.0, -1.5, -2.0]])
    versions = torch.tensor([[5, 4, -1]])
    # AReaL's v_theta = v_prox + 1: alpha = 0 for a fresh token, (5-4)/(6-4) = 1/2 for a
    # one-step-stale one; a token without a version keeps its behaviour log-prob
    prox = loglinear_proximal_logprobs(behave, current, versions, version=5)
    torch.testing.assert_close(prox, torch.tensor([[-2.0, -1.25, -3.0]]))
    # after half of the step's updates: alpha = 0 / 0.5 and 1 / 1.5
    prox = loglinear_proximal_logprobs(behave, current, versions, version=5, theta_version=5.5)
    torch.testing.assert_close(prox, torch.tensor([[-2.0, -1.0 - 0.5 * 2 / 3, -3.0]]))
    # before any update the current policy is the proximal one: exact
    prox = loglinear_proximal_logprobs(behave, current, versions, version=5, theta_version=5)
    torch.testing.assert_close(prox, torch.tensor([[-1.0, -1.5, -3.0]]))
    with pytest.raises(ValueError, match="theta_version"):
        loglinear_proximal_logprobs(behave, current, versions, version=5, theta_version=4)
    assert not loglinear_proximal_logprobs(
        behave, current.requires_grad_(), versions, 5
    ).requires_grad


def test_overlong_filter_zeroes_truncated_rows():
    mask = torch.tensor([[0.0, 1, 1], [1, 1, 0], [1, 0, 1]])
    out = overlong_filter(mask, torch.tensor([False, True, False]))
    assert out.tolist() == [[0.0, 1, 1], [0, 0, 0], [1, 0, 1]]
    with pytest.raises(ValueError, match="truncated must be"):
        overlong_filter(mask, torch.tensor([True]))


# outcome rewards 1 and 0; trained tokens 1-2 of row 0 and 0, 2, 3 of row 1; beta = 0.5
KL_REWARDS = torch.tensor([1.0, 0.0])
KL_MASK = torch.tensor([[0.0, 1, 1, 0], [1, 0, 1, 1]])
KL = torch.tensor([[9.0, 0.2, 0.1, 9.0], [0.3, 9.0, 0.1, 0.2]])


def test_kl_penalized_rewards_put_the_outcome_on_the_last_trained_token():
    r = kl_penalized_rewards(KL_REWARDS, KL, KL_MASK, kl_coef=0.5)
    expected = torch.tensor([[0.0, -0.1, 0.95, 0.0], [-0.15, 0.0, -0.05, -0.1]])
    torch.testing.assert_close(r, expected)
    with pytest.raises(ValueError, match="kl_coef"):
        kl_penalized_rewards(KL_REWARDS, KL, KL_MASK, kl_coef=-1.0)


def _whiten(values: list[float]) -> torch.Tensor:
    x = torch.tensor(values, dtype=torch.float64)
    return (x - x.mean()) / (x.std() + 1e-6)


@pytest.mark.parametrize(
    ("gamma", "returns"),
    [
        # G_t = sum of the row's later trained rewards: 0.85, 0.95 | -0.3, -0.15, -0.1
        (1.0, [0.85, 0.95, -0.3, -0.15, -0.1]),
        # discounted over trained tokens only: -0.1 + 0.5 * 0.95; -0.15 + 0.5 * (-0.05 - 0.05)
        (0.5, [0.375, 0.95, -0.2, -0.1, -0.1]),
    ],
)
def test_reinforce_pp_with_token_rewards_whitens_returns_to_go(gamma, returns):
    token_rewards = kl_penalized_rewards(KL_REWARDS, KL, KL_MASK, kl_coef=0.5)
    adv = compute_advantages(
        "reinforce_pp", token_rewards, torch.tensor([0, 0]), mask=KL_MASK, gamma=gamma
    )
    assert adv.shape == (2, 4)
    got = adv[KL_MASK > 0].to(torch.float64)
    torch.testing.assert_close(got, _whiten(returns), atol=1e-5, rtol=0)
    assert float(adv[KL_MASK == 0].abs().sum()) == 0.0
    assert math.isclose(float(got.mean()), 0.0, abs_tol=1e-6)
