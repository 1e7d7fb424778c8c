import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.algos import aggregate, kl_divergence, maj_at_k, overlong_penalty, pass_at_k

# --- KL ---------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-8, 8), min_size=1, max_size=20))
def test_k3_is_nonnegative_and_zero_at_r_equal_one(log_r):
    ref = torch.tensor([log_r], dtype=torch.float64)
    lp = torch.zeros_like(ref)
    k3 = kl_divergence("k3", lp, ref)
    assert (k3 >= 0).all()
    torch.testing.assert_close(k3, ref.exp() - ref - 1)
    assert (kl_divergence("k3", ref, ref) == 0).all()


def test_kl_estimators_values_and_k3_plus_gradient():
    lp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0]], dtype=torch.float64)
    log_r = ref - lp.detach()
    torch.testing.assert_close(kl_divergence("k1", lp, ref), -log_r)
    torch.testing.assert_close(kl_divergence("k2", lp, ref), 0.5 * log_r**2)
    k3p = kl_divergence("k3+", lp, ref)
    torch.testing.assert_close(k3p, log_r.exp() - log_r - 1)  # value of k3
    k3p.sum().backward()
    torch.testing.assert_close(lp.grad, -log_r)  # gradient of k2 = (lp - ref)


# --- aggregation ------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 9), st.integers(0, 2**31 - 1))
def test_aggregation_modes_agree_for_equal_lengths(B, L, seed):
    g = torch.Generator().manual_seed(seed)
    T = L + 3
    loss = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.zeros(B, T, dtype=torch.float64)
    mask[:, :L] = 1
    a = aggregate("token-mean", loss, mask)
    b = aggregate("seq-mean-token-mean", loss, mask)
    c = aggregate("seq-mean-token-sum-norm", loss, mask, norm_length=L)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, c)


def test_seq_mean_token_sum_norm_divides_by_a_constant():
    loss = torch.ones(2, 4)
    mask = torch.tensor([[1.0, 0, 0, 0], [1, 1, 1, 1]])
    # (1/4 + 4/4) / 2, default constant = T = 4
    assert float(aggregate("seq-mean-token-sum-norm", loss, mask)) == pytest.approx(0.625)
    assert float(aggregate("seq-mean-token-sum-norm", loss, mask, norm_length=8)) == 0.3125


def test_denominator_lets_micro_batches_sum_to_the_full_batch():
    torch.manual_seed(0)
    loss = torch.randn(4, 5)
    mask = (torch.rand(4, 5) > 0.3).float()
    mask[:, 0] = 1
    for mode, denom in (
        ("token-mean", float(mask.sum())),
        ("seq-mean-token-mean", 4.0),
        ("seq-mean-token-sum-norm", 4.0),
    ):
        full = aggregate(mode, loss, mask)
        parts = sum(
            aggregate(mode, loss[i : i + 2], mask[i : i + 2], denominator=denom) for i in (0, 2)
        )
        torch.testing.assert_close(full, parts)


# --- DAPO overlong ----------------------------------------------------------------------


def test_overlong_penalty_three_regimes():
    lengths = torch.tensor([100, 768, 800, 896, 1024, 1025, 4000])
    pen = overlong_penalty(lengths, max_len=1024, cache_len=256)
    expected = torch.tensor([0.0, 0.0, -32 / 256, -0.5, -1.0, -1.0, -1.0])
    torch.testing.assert_close(pen, expected)
    hard = overlong_penalty(torch.tensor([1024, 1025]), max_len=1024, cache_len=0)
    torch.testing.assert_close(hard, torch.tensor([0.0, -1.0]))
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(lengths, max_len=10, cache_len=20)


# --- pass@k / maj@k -------------------------------------------------------------------


def test_pass_at_k_edge_cases():
    assert pass_at_k(10, 0, 1) == 0.0
    assert pass_at_k(10, 10, 5) == 1.0
    assert pass_at_k(5, 1, 5) == 1.0  # n - c = 4 < k = 5: every draw holds the correct one
    assert pass_at_k(5, 2, 4) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # 1 - C(2,2)/C(4,2)
    assert pass_at_k(1, 1, 1) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


@settings(max_examples=50, deadline=None)
@given(
    st.integers(1, 40).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))
    )
)
def test_pass_at_k_matches_binomial_formula(args):
    from math import comb

    n, c, k = args
    expected = 1.0 - comb(n - c, k) / comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_maj_at_k():
    answers = ["3", "4", "4", None, "3", "3"]
    assert maj_at_k(answers, "4", k=3) == 1.0
    assert maj_at_k(answers, "3") == 1.0
    assert maj_at_k(["1", "2"], "1") == 1.0  # tie: first seen wins
    assert maj_at_k([None, None], "1") == 0.0


def test_maj_at_k_with_the_answers_a_verifier_accepted():
    answers = ["4.0", "4", "3", "4.0"]
    assert maj_at_k(answers, {"4", "4.0"}) == 1.0
    assert maj_at_k(answers, frozenset({"3"})) == 0.0
    assert maj_at_k(answers, set()) == 0.0  # nothing was accepted
    assert maj_at_k(["3", "4"], {"4"}, k=1) == 0.0
