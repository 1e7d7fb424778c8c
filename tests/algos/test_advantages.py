import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.algos import (
    ADVANTAGES,
    aggregate,
    compute_advantages,
    compute_gae,
    dynamic_sampling_mask,
    estimate_advantages,
    place_outcome_rewards,
)


def test_three_responses_mean_centred_and_token_weights():
    # group of 2, 6, 6 tokens with rewards +1, +1, -1
    rewards = torch.tensor([1.0, 1.0, -1.0])
    adv = compute_advantages("dr_grpo", rewards, torch.zeros(3, dtype=torch.long))
    torch.testing.assert_close(adv, torch.tensor([2 / 3, 2 / 3, -4 / 3]))

    mask = torch.zeros(3, 6)
    mask[0, :2] = 1
    mask[1:] = 1
    # d(aggregate)/d(loss[i, t]) is the weight each token gets
    loss = torch.zeros(3, 6, requires_grad=True)
    aggregate("seq-mean-token-mean", loss, mask).backward()
    expected = torch.zeros(3, 6)
    expected[0, :2] = 1 / (3 * 2)
    expected[1:] = 1 / (3 * 6)
    torch.testing.assert_close(loss.grad, expected)

    loss.grad = None
    aggregate("token-mean", loss, mask).backward()
    torch.testing.assert_close(loss.grad, mask / 14)


def test_grpo_normalises_by_unbiased_group_std():
    r = torch.tensor([1.0, 0.0, 0.0, 5.0, 5.0])
    g = torch.tensor([7, 7, 7, 9, 9])
    adv = compute_advantages("grpo", r, g)
    std = torch.tensor([1.0, 0.0, 0.0]).std()
    expected = torch.tensor([2 / 3, -1 / 3, -1 / 3]) / (std + 1e-6)
    torch.testing.assert_close(adv[:3], expected)
    # all-equal group: advantage 0, not NaN
    torch.testing.assert_close(adv[3:], torch.zeros(2))


def test_rloo_leave_one_out_baseline():
    r = torch.tensor([1.0, 2.0, 6.0])
    adv = compute_advantages("rloo", r, torch.zeros(3, dtype=torch.long))
    torch.testing.assert_close(adv, torch.tensor([1 - 4.0, 2 - 3.5, 6 - 1.5]))


def test_reinforce_pp_whitens_over_batch_and_baseline_variant():
    r = torch.tensor([1.0, 2.0, 3.0, 10.0])
    g = torch.tensor([0, 0, 1, 1])
    adv = compute_advantages("reinforce_pp", r, g)
    torch.testing.assert_close(adv, (r - r.mean()) / (r.std() + 1e-6))
    adv_b = compute_advantages("reinforce_pp_baseline", r, g)
    centred = torch.tensor([-0.5, 0.5, -3.5, 3.5])
    torch.testing.assert_close(adv_b, centred / (centred.std() + 1e-6))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"])
def test_invalid_rows_leave_the_baseline_and_get_zero(name):
    r = torch.tensor([1.0, 0.0, float("nan"), 1.0, 0.0])
    g = torch.tensor([0, 0, 0, 1, 1])
    valid = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0])
    adv = compute_advantages(name, r, g, valid=valid)
    assert adv[2] == 0.0
    assert torch.isfinite(adv).all()
    # the infra row does not shift its group's baseline: same as a batch without it
    clean = compute_advantages(name, r[[0, 1, 3, 4]], g[[0, 1, 3, 4]], valid=torch.ones(4))
    torch.testing.assert_close(adv[[0, 1, 3, 4]], clean)


def test_all_equal_inexact_rewards_give_exactly_small_advantages():
    # float32 rounding of the mean must not be blown up by the std division
    r = torch.full((3,), 5.997002774923789)
    adv = compute_advantages("grpo", r, torch.zeros(3, dtype=torch.long))
    assert adv.abs().max() < 1e-6


def test_singleton_groups_get_zero_advantage():
    adv = compute_advantages("grpo", torch.tensor([1.0, 3.0]), torch.tensor([0, 1]))
    torch.testing.assert_close(adv, torch.zeros(2))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.floats(-10, 10, allow_nan=False), st.booleans()),
        min_size=1,
        max_size=40,
    )
)
def test_grpo_advantages_sum_to_zero_per_group(rows):
    g = torch.tensor([r[0] for r in rows])
    r = torch.tensor([r[1] for r in rows], dtype=torch.float64).float()
    valid = torch.tensor([float(r[2]) for r in rows])
    for name in ("grpo", "dr_grpo", "rloo"):
        adv = compute_advantages(name, r, g, valid=valid)
        for gid in g.unique():
            sel = g == gid
            assert abs(float(adv[sel].sum())) < 1e-3 * max(1.0, float(adv[sel].abs().max()))
        assert (adv[valid == 0] == 0).all()


def _reward_to_go(r):
    return torch.flip(torch.cumsum(torch.flip(r, [1]), 1), [1])


def test_gae_lambda_gamma_one_is_reward_to_go_minus_values():
    torch.manual_seed(0)
    r, v = torch.randn(3, 7), torch.randn(3, 7)
    mask = torch.ones(3, 7)
    adv, ret = compute_gae(r, v, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, _reward_to_go(r) - v)
    torch.testing.assert_close(ret, _reward_to_go(r))


def test_gae_lambda_zero_is_td0():
    torch.manual_seed(1)
    r, v = torch.randn(2, 6), torch.randn(2, 6)
    gamma = 0.9
    adv, _ = compute_gae(r, v, torch.ones(2, 6), gamma=gamma, lam=0.0)
    next_v = torch.cat([v[:, 1:], torch.zeros(2, 1)], dim=1)
    torch.testing.assert_close(adv, r + gamma * next_v - v)


def test_gae_passes_through_observation_tokens():
    # model tokens at 0,1 | observation at 2,3 | model at 4 ; reward 1 on the last token
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]])
    v = torch.tensor([[0.1, 0.2, 9.0, 9.0, 0.5]])
    r = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]])
    g, lam = 0.9, 0.8
    adv, ret = compute_gae(r, v, mask, gamma=g, lam=lam)
    a4 = 1.0 - 0.5
    a1 = (0.0 + g * 0.5 - 0.2) + g * lam * a4  # bootstraps from position 4, not 2
    a0 = (0.0 + g * 0.2 - 0.1) + g * lam * a1
    expected = torch.tensor([[a0, a1, 0.0, 0.0, a4]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, (expected + v) * mask)
    # equals GAE on the same sequence with the observation tokens removed
    keep = [0, 1, 4]
    adv_c, _ = compute_gae(r[:, keep], v[:, keep], mask[:, keep], gamma=g, lam=lam)
    torch.testing.assert_close(adv[:, keep], adv_c)


def test_gae_through_registry_places_outcome_reward():
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    placed = place_outcome_rewards(torch.tensor([2.0, -1.0]), mask)
    torch.testing.assert_close(placed, torch.tensor([[0, 0, 2.0, 0], [0, -1.0, 0, 0]]))
    values = torch.zeros(2, 4)
    rewards, group_ids = torch.tensor([2.0, -1.0]), torch.tensor([0, 0])
    raw = torch.tensor([[0, 2.0, 2.0, 0], [0, -1.0, 0, 0]])
    adv = compute_advantages(
        "gae", rewards, group_ids, values=values, mask=mask, whiten_advantages=False
    )
    torch.testing.assert_close(adv, raw)
    with pytest.raises(ValueError, match="values="):
        compute_advantages("gae", torch.tensor([1.0]), torch.tensor([0]))


def test_gae_whitens_over_trained_tokens_and_returns_value_targets():
    assert ADVANTAGES.needs_critic("gae") and not ADVANTAGES.needs_critic("grpo")
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    values = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.0, 0.25, 0.0, 0.0]])
    rewards, group_ids = torch.tensor([2.0, -1.0]), torch.tensor([0, 0])
    adv, returns = estimate_advantages(
        "gae", rewards, group_ids, values=values, mask=mask, gamma=1.0, lam=1.0
    )
    raw = torch.tensor([[0.0, 1.5, 1.5, 0.0], [0.0, -1.25, 0.0, 0.0]])
    torch.testing.assert_close(returns, (raw + values) * mask)  # targets from raw advantages
    sel = adv[mask > 0]
    assert float(sel.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(sel.std()) == pytest.approx(1.0, abs=1e-5)
    assert torch.all(adv[mask == 0] == 0)
    # an infra_error row (valid 0) takes no part
    valid = torch.tensor([1.0, 0.0])
    adv_v, _ = estimate_advantages(
        "gae", rewards, group_ids, valid=valid, values=values, mask=mask, whiten_advantages=False
    )
    torch.testing.assert_close(adv_v, raw * torch.tensor([[1.0], [0.0]]))


def test_group_estimators_take_no_critic_and_no_unknown_options():
    r, g = torch.tensor([1.0, 0.0]), torch.tensor([0, 0])
    adv, returns = estimate_advantages("grpo", r, g, eps=1e-3)
    assert returns is None and adv.shape == (2,)
    with pytest.raises(ValueError, match="uses no critic"):
        estimate_advantages("rloo", r, g, values=torch.zeros(2, 3))
    with pytest.raises(TypeError, match="whiten_advantages"):
        compute_advantages("dr_grpo", r, g, whiten_advantages=True)  # not silently swallowed


def test_dynamic_sampling_drops_uniform_groups():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    g = torch.tensor([0, 0, 1, 1, 2, 2, 3])
    valid = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    keep = dynamic_sampling_mask(r, g, valid=valid)
    assert keep.tolist() == [False, False, True, True, False, False, False]


def test_bad_shapes_name_the_field():
    with pytest.raises(ValueError, match=r"advantage .grpo. takes outcome rewards \[B\]"):
        compute_advantages("grpo", torch.zeros(2, 2), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="group_ids"):
        compute_advantages("grpo", torch.zeros(3), torch.zeros(2, dtype=torch.long))
    assert math.isfinite(float(compute_advantages("grpo", torch.zeros(3), torch.zeros(3)).sum()))


def test_rewards_are_routed_by_the_estimators_registration_with_a_shape_error():
    r2, g, mask = torch.ones(2, 3), torch.tensor([0, 0]), torch.ones(2, 3)
    # an outcome estimator given per-token rewards: named, with the shape it takes
    with pytest.raises(
        ValueError,
        match=r"advantage 'grpo' takes outcome rewards \[B\].*reinforce_pp.*shape \(2, 3\)",
    ):
        estimate_advantages("grpo", r2, g, mask=mask)
    with pytest.raises(
        ValueError,
        match=r"'reinforce_pp' takes outcome rewards \[B\] or per-token rewards \[B, T\]; got rewards of shape \(2, 3, 1\)",
    ):
        estimate_advantages("reinforce_pp", r2[..., None], g, mask=mask)
    adv, returns = estimate_advantages("reinforce_pp", r2, g, mask=mask, gamma=1.0)
    assert adv.shape == (2, 3) and returns is None

    seen: dict[str, object] = {}

    # its signature names mask and gamma, its registration declares neither: it gets neither
    @ADVANTAGES.register("test_routed_outcome", inputs=())
    def routed(rewards, group_ids, *, valid=None, mask=None, gamma=None):
        seen.update(mask=mask, gamma=gamma)
        return rewards - rewards.mean()

    try:
        estimate_advantages(
            "test_routed_outcome", torch.tensor([1.0, 0.0]), g, mask=mask, gamma=0.5
        )
        assert seen == {"mask": None, "gamma": None}
        with pytest.raises(ValueError, match="'test_routed_outcome' takes outcome rewards"):
            estimate_advantages("test_routed_outcome", r2, g, mask=mask)
    finally:
        ADVANTAGES._fns.pop("test_routed_outcome", None)
