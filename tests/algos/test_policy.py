import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.algos import entropy_bonus, importance_weights, policy_loss, value_loss
from agentrl.errors import UnknownNameError


def _lp(ratios, requires_grad=True):
    lp = torch.log(torch.tensor([ratios], dtype=torch.float64))
    return lp.requires_grad_(requires_grad)


def test_token_level_worked_example_is_0_8():
    # ratios 2.0 and 0.4, A = 1, eps = 0.2: (min(2.0, 1.2) + min(0.4, 0.8)) / 2 = 0.8
    lp = _lp([2.0, 0.4])
    old = torch.zeros(1, 2, dtype=torch.float64)
    loss, m = policy_loss(
        "ppo", lp, old, torch.ones(1), torch.ones(1, 2), eps_low=0.2, eps_high=0.2
    )
    assert -loss.item() == pytest.approx(0.8, abs=1e-9)
    assert -loss.item() != pytest.approx(1.0)
    assert m["clip_frac"] == pytest.approx(0.5)
    assert m["ratio_max"] == pytest.approx(2.0)
    loss.backward()
    # the 2.0 token is clipped (no gradient); the 0.4 token keeps d/dlogp = -A * r / 2
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, -0.2]], dtype=torch.float64))


def test_sequence_level_gspo_worked_example_is_0_894():
    lp = _lp([2.0, 0.4])
    old = torch.zeros(1, 2, dtype=torch.float64)
    loss, m = policy_loss(
        "gspo", lp, old, torch.ones(1), torch.ones(1, 2), eps_low=0.2, eps_high=0.2
    )
    s = math.exp((math.log(2.0) + math.log(0.4)) / 2)
    assert s == pytest.approx(0.894, abs=5e-4)
    assert -loss.item() == pytest.approx(s, abs=1e-9)
    assert m["ratio_mean"] == pytest.approx(s)
    assert m["clip_frac"] == 0.0
    # gspo_token has the same value
    loss_t, _ = policy_loss(
        "gspo_token", lp, old, torch.ones(1), torch.ones(1, 2), eps_low=0.2, eps_high=0.2
    )
    assert -loss_t.item() == pytest.approx(s, abs=1e-9)


def test_gspo_token_matches_gspo_gradient_with_sequence_advantages():
    torch.manual_seed(0)
    lp = (torch.randn(3, 5, dtype=torch.float64) * 0.01).requires_grad_()
    old = torch.zeros(3, 5, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    grads = []
    for name in ("gspo", "gspo_token"):
        lp.grad = None
        loss, _ = policy_loss(
            name, lp, old, adv, mask, agg="seq-mean-token-mean", eps_low=0.2, eps_high=0.2
        )
        loss.backward()
        grads.append(lp.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


def test_gspo_clips_whole_sequences():
    lp = torch.log(torch.tensor([[2.0, 2.0], [1.0, 1.05]], dtype=torch.float64)).requires_grad_()
    loss, m = policy_loss(
        "gspo",
        lp,
        torch.zeros(2, 2, dtype=torch.float64),
        torch.ones(2),
        torch.ones(2, 2),
        eps_low=0.2,
        eps_high=0.2,
        agg="seq-mean-token-mean",
    )
    loss.backward()
    assert (lp.grad[0] == 0).all() and (lp.grad[1] != 0).all()
    assert m["seq_clip_frac"] == pytest.approx(0.5)


def test_dual_clip_bounds_negative_advantage_loss():
    lp = _lp([5.0, 0.5])
    old = torch.zeros(1, 2, dtype=torch.float64)
    adv = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    loss, m = policy_loss(
        "ppo", lp, old, adv, torch.ones(1, 2), eps_low=0.2, eps_high=0.2, dual_clip_c=3.0
    )
    # token 1: max(5, 1.2) = 5 bounded by c * |A| = 3 ; token 2: max(0.5, 0.8) = 0.8
    assert loss.item() == pytest.approx((3.0 + 0.8) / 2)
    assert m["dual_clip_frac"] == pytest.approx(0.5)
    loss.backward()
    assert lp.grad[0, 0] == 0.0


def test_clip_higher_uses_separate_bounds():
    lp = _lp([1.25, 0.75])
    old = torch.zeros(1, 2, dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    loss, m = policy_loss("ppo", lp, old, adv, torch.ones(1, 2), eps_low=0.2, eps_high=0.28)
    # 1.25 < 1.28 not clipped ; 0.75 < 0.8 clipped for A < 0 -> -(-1 * 0.8) = 0.8
    assert loss.item() == pytest.approx((-1.25 + 0.8) / 2)
    assert m["clip_frac_low"] == pytest.approx(0.5) and m["clip_frac_high"] == 0.0


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(-1.5, 1.5), st.floats(-3, 3).filter(lambda a: abs(a) > 1e-3)),
        min_size=1,
        max_size=16,
    ),
    st.floats(0.01, 0.5),
    st.floats(0.01, 0.5),
)
def test_gradient_vanishes_exactly_where_the_clip_binds(tokens, eps_low, eps_high):
    log_r = torch.tensor([[t[0] for t in tokens]], dtype=torch.float64)
    adv = torch.tensor([[t[1] for t in tokens]], dtype=torch.float64)
    lp = log_r.clone().requires_grad_()
    mask = torch.ones_like(log_r)
    loss, _ = policy_loss(
        "ppo", lp, torch.zeros_like(log_r), adv, mask, eps_low=eps_low, eps_high=eps_high
    )
    loss.backward()
    r = log_r.exp()
    binds = ((adv > 0) & (r > 1 + eps_high)) | ((adv < 0) & (r < 1 - eps_low))
    assert (lp.grad[binds] == 0).all()
    n = log_r.numel()
    torch.testing.assert_close(lp.grad[~binds], (-adv * r / n)[~binds])


def test_tis_weights_truncate_and_are_detached():
    old = torch.log(torch.tensor([[0.5, 0.9]]))
    behavior = torch.log(torch.tensor([[0.1, 0.9]]))
    w = importance_weights(old, behavior, cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.0]]))
    w_mask = importance_weights(old, behavior, cap=2.0, mode="mask")
    torch.testing.assert_close(w_mask, torch.tensor([[0.0, 1.0]]))


@pytest.mark.parametrize("correction", ["tis", "decoupled"])
def test_off_policy_corrections_weight_the_clipped_objective(correction):
    # current / proximal / behaviour probabilities of two tokens
    cur = torch.tensor([[0.6, 0.3]], dtype=torch.float64)
    prox = torch.tensor([[0.5, 0.4]], dtype=torch.float64)
    beh = torch.tensor([[0.2, 0.5]], dtype=torch.float64)
    lp = cur.log().requires_grad_()
    loss, m = policy_loss(
        "ppo",
        lp,
        prox.log(),
        torch.ones(1),
        torch.ones(1, 2),
        behavior_logprobs=beh.log(),
        correction=correction,
        is_cap=2.0,
        eps_low=0.2,
        eps_high=0.2,
    )
    r = cur / prox  # 1.2, 0.75
    w = torch.minimum(prox / beh, torch.tensor(2.0, dtype=torch.float64))  # 2.0, 0.8
    per_tok = torch.minimum(r, r.clamp(0.8, 1.2)) * w
    assert -loss.item() == pytest.approx(float(per_tok.mean()))
    assert m["is_weight_max"] == pytest.approx(2.0)
    assert m["is_weight_mean"] == pytest.approx(1.4)
    assert m["is_capped_frac"] == pytest.approx(0.5)
    loss.backward()
    # the weight is a constant: d/dlogp = -w * r / 2 on the unclipped token
    assert float(lp.grad[0, 1]) == pytest.approx(-0.8 * 0.75 / 2)


def test_correction_needs_behavior_logprobs_and_known_name():
    lp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="behavior_logprobs"):
        policy_loss("ppo", lp, lp, torch.ones(1), torch.ones(1, 2), correction="tis")
    with pytest.raises(UnknownNameError, match="decoupled"):
        policy_loss("ppo", lp, lp, torch.ones(1), torch.ones(1, 2), correction="decoupld")


def test_unknown_loss_kwarg_is_named():
    lp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="eps_high"):
        policy_loss("ppo", lp, lp, torch.ones(1), torch.ones(1, 2), eps_hihg=0.3)


def test_sequence_and_token_advantages_agree():
    torch.manual_seed(3)
    lp = torch.randn(2, 4) * 0.3
    old = torch.randn(2, 4) * 0.3
    mask = torch.tensor([[1.0, 1, 0, 0], [1, 1, 1, 1]])
    adv = torch.tensor([0.7, -1.1])
    a, _ = policy_loss("ppo", lp, old, adv, mask)
    b, _ = policy_loss("ppo", lp, old, adv[:, None].expand(2, 4), mask)
    torch.testing.assert_close(a, b)


def test_value_loss_clipping():
    values = torch.tensor([[1.0, 0.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0]])
    ret = torch.tensor([[0.0, 2.0]])
    loss, m = value_loss(values, old, ret, torch.ones(1, 2), clip=0.2)
    # token 1: max((1-0)^2, (0.2-0)^2) = 1 ; token 2: max((0-2)^2, (0-2)^2) = 4
    assert loss.item() == pytest.approx(0.5 * (1 + 4) / 2)
    loss_u, _ = value_loss(values, old, torch.tensor([[2.0, 2.0]]), torch.ones(1, 2), clip=0.2)
    # token 1 clipped prediction 0.2 is further from 2 than 1.0: the clipped term wins
    assert loss_u.item() == pytest.approx(0.5 * ((2 - 0.2) ** 2 + 4) / 2)
    assert m["vf_clip_frac"] == 0.0
    loss_n, _ = value_loss(values, old, ret, torch.ones(1, 2), clip=None)
    assert loss_n.item() == pytest.approx(0.5 * (1 + 4) / 2)


def test_entropy_bonus_is_the_aggregated_entropy():
    ent = torch.tensor([[1.0, 3.0, 100.0]])
    assert float(entropy_bonus(ent, torch.tensor([[1.0, 1.0, 0.0]]))) == pytest.approx(2.0)
