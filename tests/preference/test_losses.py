"""Each preference loss against its paper's formula, computed by hand with `math` on
fixed per-pair log-probs (the same numbers TRL's implementations take)."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.errors import ConfigError, UnknownNameError
from agentrl.preference import PREFERENCE_LOSSES, PairLogps, UnpairedLogps, preference_loss

# two pairs: log pi(y_w|x), log pi(y_l|x), reference, token counts
LOGP_W, LOGP_L = [-12.0, -30.5], [-15.0, -28.0]
REF_W, REF_L = [-13.0, -29.0], [-14.5, -29.5]
LEN_W, LEN_L = [6.0, 20.0], [9.0, 14.0]


def pairs(reference: bool = True) -> PairLogps:
    t = torch.tensor
    return PairLogps(
        t(LOGP_W, dtype=torch.float64),
        t(LOGP_L, dtype=torch.float64),
        t(LEN_W, dtype=torch.float64),
        t(LEN_L, dtype=torch.float64),
        t(REF_W, dtype=torch.float64) if reference else None,
        t(REF_L, dtype=torch.float64) if reference else None,
    )


def log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x))


def h(i: int) -> float:
    """log [pi(y_w) pi_ref(y_l)] / [pi(y_l) pi_ref(y_w)] of pair i."""
    return (LOGP_W[i] - REF_W[i]) - (LOGP_L[i] - REF_L[i])


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def test_dpo_eq7() -> None:
    beta = 0.1
    want = mean([-log_sigmoid(beta * h(i)) for i in range(2)])
    out = preference_loss("dpo", pairs(), beta=beta)
    assert float(out.loss) == pytest.approx(want, rel=1e-12)
    assert out.chosen_rewards.tolist() == pytest.approx([beta * 1.0, beta * -1.5])
    assert out.rejected_rewards.tolist() == pytest.approx([beta * -0.5, beta * 1.5])


def test_conservative_and_robust_dpo() -> None:
    beta, eps = 0.5, 0.2
    cdpo = mean(
        [-(1 - eps) * log_sigmoid(beta * h(i)) - eps * log_sigmoid(-beta * h(i)) for i in range(2)]
    )
    assert float(preference_loss("dpo", pairs(), beta=beta, label_smoothing=eps).loss) == (
        pytest.approx(cdpo, rel=1e-12)
    )
    assert float(preference_loss("cdpo", pairs(), beta=beta, label_smoothing=eps).loss) == (
        pytest.approx(cdpo, rel=1e-12)
    )
    # Chowdhury et al. 2024, Eq. 8
    robust = mean(
        [
            ((1 - eps) * -log_sigmoid(beta * h(i)) + eps * log_sigmoid(-beta * h(i)))
            / (1 - 2 * eps)
            for i in range(2)
        ]
    )
    out = preference_loss("robust", pairs(), beta=beta, label_smoothing=eps)
    assert float(out.loss) == pytest.approx(robust, rel=1e-12)
    with pytest.raises(ConfigError, match=r"label_smoothing < 0\.5"):
        preference_loss("robust", pairs(), label_smoothing=0.5)


def test_ipo_eq17() -> None:
    tau = 0.25
    want = mean([(h(i) - 1 / (2 * tau)) ** 2 for i in range(2)])
    assert float(preference_loss("ipo", pairs(), beta=tau).loss) == pytest.approx(want, rel=1e-12)
    # TRL's variant: per-token mean log-probs
    hn = [(LOGP_W[i] - REF_W[i]) / LEN_W[i] - (LOGP_L[i] - REF_L[i]) / LEN_L[i] for i in range(2)]
    want = mean([(x - 1 / (2 * tau)) ** 2 for x in hn])
    out = preference_loss("ipo", pairs(), beta=tau, length_normalize=True)
    assert float(out.loss) == pytest.approx(want, rel=1e-12)


def test_hinge() -> None:
    beta = 2.0
    want = mean([max(0.0, 1 - beta * h(i)) for i in range(2)])
    assert float(preference_loss("hinge", pairs(), beta=beta).loss) == pytest.approx(want)


def test_orpo_eqs_4_to_7() -> None:
    lam = 0.2

    def log_odds(logp: float, n: float) -> float:
        p = math.exp(logp / n)  # P(y|x): the geometric mean of the token probabilities
        return math.log(p / (1 - p))

    l_or = mean(
        [
            -log_sigmoid(log_odds(LOGP_W[i], LEN_W[i]) - log_odds(LOGP_L[i], LEN_L[i]))
            for i in range(2)
        ]
    )
    l_sft = -sum(LOGP_W) / sum(LEN_W)
    out = preference_loss("orpo", pairs(reference=False), lam=lam)
    assert float(out.loss) == pytest.approx(l_sft + lam * l_or, rel=1e-12)
    assert out.metrics["nll"] == pytest.approx(l_sft)
    assert not PREFERENCE_LOSSES.needs_reference("orpo")


def test_rpo_is_dpo_plus_the_chosen_answers_length_normalised_nll() -> None:
    beta, alpha = 0.1, 0.7
    dpo = mean([-log_sigmoid(beta * h(i)) for i in range(2)])
    nll = mean([-LOGP_W[i] / LEN_W[i] for i in range(2)])  # 12/6 and 30.5/20
    out = preference_loss("rpo", pairs(), beta=beta, alpha=alpha)
    assert float(out.loss) == pytest.approx(dpo + alpha * nll, rel=1e-12)
    assert out.metrics["nll"] == pytest.approx((2.0 + 1.525) / 2)
    assert out.chosen_rewards.tolist() == pytest.approx([beta * 1.0, beta * -1.5])
    # alpha 0 is DPO
    assert float(preference_loss("rpo", pairs(), beta=beta, alpha=0.0).loss) == pytest.approx(dpo)
    with pytest.raises(ConfigError, match="alpha must be >= 0"):
        preference_loss("rpo", pairs(), alpha=-1.0)


def test_simpo_eq6() -> None:
    beta, gamma = 2.5, 1.0
    want = mean(
        [
            -log_sigmoid(beta / LEN_W[i] * LOGP_W[i] - beta / LEN_L[i] * LOGP_L[i] - gamma)
            for i in range(2)
        ]
    )
    out = preference_loss("simpo", pairs(reference=False), beta=beta, gamma=gamma)
    assert float(out.loss) == pytest.approx(want, rel=1e-12)
    assert not PREFERENCE_LOSSES.needs_reference("simpo")


def test_tdpo1_and_tdpo2() -> None:
    """Zeng et al. 2024: u = beta h, delta = beta (SeqKL_l - SeqKL_w);
    TDPO1 -log sigma(u - delta); TDPO2 -log sigma(u - alpha delta), no gradient through
    the chosen side's KL."""
    beta, alpha = 0.5, 0.3
    kl_w, kl_l = [0.25, 1.5], [0.75, 0.5]
    t = torch.tensor
    with_kl = pairs()
    with_kl.seq_kl_w = t(kl_w, dtype=torch.float64, requires_grad=True)
    with_kl.seq_kl_l = t(kl_l, dtype=torch.float64, requires_grad=True)
    delta = [beta * (kl_l[i] - kl_w[i]) for i in range(2)]
    tdpo1 = mean([-log_sigmoid(beta * h(i) - delta[i]) for i in range(2)])
    tdpo2 = mean([-log_sigmoid(beta * h(i) - alpha * delta[i]) for i in range(2)])
    out1 = preference_loss("tdpo", with_kl, beta=beta, variant=1)
    assert float(out1.loss.detach()) == pytest.approx(tdpo1, rel=1e-12)
    out2 = preference_loss("tdpo", with_kl, beta=beta, alpha=alpha)  # variant 2 by default
    assert float(out2.loss.detach()) == pytest.approx(tdpo2, rel=1e-12)
    assert out2.metrics["seq_kl_chosen"] == pytest.approx(mean(kl_w))
    out2.loss.backward()
    assert with_kl.seq_kl_w.grad is None  # sg(): only the rejected side's KL is pushed
    assert with_kl.seq_kl_l.grad is not None and (with_kl.seq_kl_l.grad != 0).all()
    # d/dKL_l of -log sigma(z), z = u - alpha beta (KL_l - KL_w): sigma(-z) alpha beta / B
    z = [beta * h(i) - alpha * delta[i] for i in range(2)]
    want = [alpha * beta / (1 + math.exp(zi)) / 2 for zi in z]
    assert with_kl.seq_kl_l.grad.tolist() == pytest.approx(want, rel=1e-12)
    assert PREFERENCE_LOSSES.token_kl("tdpo") and not PREFERENCE_LOSSES.token_kl("dpo")
    with pytest.raises(ValueError, match="sequential KLs"):
        preference_loss("tdpo", pairs())
    with pytest.raises(ConfigError, match="variant must be 1 or 2"):
        preference_loss("tdpo", with_kl, variant=3)


def test_kto_eq8_with_the_batch_kl_estimate() -> None:
    beta, lambda_d, lambda_u = 0.1, 1.0, 1.5
    logp, ref = [-10.0, -20.0, -7.0], [-11.0, -19.0, -7.5]
    desirable = [True, False, True]
    kl_logp, kl_ref = [-25.0, -30.0, -22.0], [-27.0, -29.0, -23.0]
    z_0 = max(0.0, mean([a - b for a, b in zip(kl_logp, kl_ref, strict=True)]))
    assert z_0 == pytest.approx(2 / 3)

    def sig(x: float) -> float:
        return 1 / (1 + math.exp(-x))

    losses = []
    for lp, rp, good in zip(logp, ref, desirable, strict=True):
        r = lp - rp
        v = lambda_d * sig(beta * (r - z_0)) if good else lambda_u * sig(beta * (z_0 - r))
        losses.append((lambda_d if good else lambda_u) - v)
    t = torch.tensor
    batch = UnpairedLogps(
        t(logp), t([5.0, 5.0, 5.0]), t(desirable), t(ref), t(kl_logp, requires_grad=True), t(kl_ref)
    )
    out = preference_loss("kto", batch, beta=beta, lambda_d=lambda_d, lambda_u=lambda_u)
    assert float(out.loss) == pytest.approx(mean(losses), rel=1e-6)
    assert out.metrics["kl"] == pytest.approx(z_0)
    assert not out.loss.requires_grad  # z_0 carries no gradient (nothing else did here)
    assert PREFERENCE_LOSSES.unpaired("kto")


def test_unknown_names_and_options_are_one_line_errors() -> None:
    with pytest.raises(UnknownNameError, match="did you mean 'dpo'"):
        preference_loss("dpoo", pairs())
    with pytest.raises(
        ConfigError, match="'simpo' takes no option 'tau'; its options: beta, gamma"
    ):
        preference_loss("simpo", pairs(), tau=1.0)
    with pytest.raises(ValueError, match="needs the reference"):
        preference_loss("dpo", pairs(reference=False))
