"""CISPO, SAPO, M2PO and prime-rl's DPPO+KL loss against numbers computed by hand in numpy,
and each one selected from a YAML file."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentrl.algos import policy_loss
from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.learner.objective import check_algorithm
from agentrl.run.settings import objective_settings


def _loss_and_grad(name: str, lp, old, adv, **kw):
    lp_t = torch.tensor(lp, dtype=torch.float64, requires_grad=True)
    loss, metrics = policy_loss(
        name,
        lp_t,
        torch.tensor(old, dtype=torch.float64),
        torch.tensor(adv, dtype=torch.float64),
        torch.ones(lp_t.shape),
        agg="token-mean",
        **kw,
    )
    loss.backward()
    return float(loss.detach()), lp_t.grad.numpy(), metrics


LP = [[0.5, -0.1, 0.0], [-0.7, 0.2, 0.05]]
OLD = [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
ADV = [[1.0, 1.0, 1.0], [-2.0, -2.0, 0.5]]


def test_cispo_clipped_detached_weight_on_every_tokens_log_prob():
    lp, adv = np.array(LP), np.array(ADV)
    r = np.exp(lp)  # old = 0
    w = np.minimum(r, 1.28)  # no lower bound, eps_high 0.28
    want = np.mean(-w * adv * lp)
    want_grad = -w * adv / lp.size  # the weight is a constant: d/dlp of -w A lp
    loss, grad, m = _loss_and_grad("cispo", LP, OLD, ADV, eps_high=0.28)
    assert loss == pytest.approx(want, abs=1e-12)
    assert np.allclose(grad, want_grad, atol=1e-12)
    # the token whose ratio e^0.5 = 1.65 is clipped still gets gradient (PPO would drop it)
    assert grad[0, 0] == pytest.approx(-1.28 / 6, abs=1e-12)
    assert float(m["clip_frac"]) == pytest.approx(1 / 6)
    # a lower bound, when given, raises the weight of r = e^-0.7 = 0.50 to 0.8
    loss2, grad2, _ = _loss_and_grad("cispo", LP, OLD, ADV, eps_high=0.28, eps_low_is=0.2)
    w2 = np.clip(r, 0.8, 1.28)
    assert loss2 == pytest.approx(np.mean(-w2 * adv * lp), abs=1e-12)
    assert grad2[1, 0] == pytest.approx(-0.8 * -2.0 / 6, abs=1e-12)


def test_sapo_soft_gate_with_sign_dependent_temperatures():
    lp, adv = np.array(LP), np.array(ADV)
    r = np.exp(lp)
    tau = np.where(adv > 0, 1.0, 1.05)
    s = 1.0 / (1.0 + np.exp(-tau * (r - 1.0)))
    want = np.mean(-(4.0 / tau) * s * adv)
    # d/dlp [-(4/tau) sigmoid(tau (r - 1)) A] = -4 s (1 - s) r A
    want_grad = -4.0 * s * (1.0 - s) * r * adv / lp.size
    loss, grad, _ = _loss_and_grad("sapo", LP, OLD, ADV, tau_pos=1.0, tau_neg=1.05)
    assert loss == pytest.approx(want, abs=1e-12)
    assert np.allclose(grad, want_grad, atol=1e-12)
    # on-policy (r = 1) the gate's weight is exactly 1: the plain policy gradient
    _, g0, m0 = _loss_and_grad("sapo", OLD, OLD, ADV)
    assert np.allclose(g0, -np.array(ADV) / 6, atol=1e-12)
    assert float(m0["gate_weight_mean"]) == pytest.approx(1.0)


def _m2po_by_hand(lp: np.ndarray, tau: float) -> np.ndarray:
    """The paper's loop: mask the largest (log r)^2 while the mean of the rest is > tau."""
    sq = (lp**2).flatten()
    keep = np.ones_like(sq, dtype=bool)
    while keep.any() and sq[keep].mean() > tau:
        idx = np.where(keep)[0]
        keep[idx[np.argmax(sq[idx])]] = False
    return keep.reshape(lp.shape)


@pytest.mark.parametrize("tau", [0.04, 0.005, 1.0])
def test_m2po_masks_the_largest_squared_log_ratios_until_the_second_moment_fits(tau):
    lp, adv = np.array(LP), np.array(ADV)
    keep = _m2po_by_hand(lp, tau).astype(float)
    r = np.exp(lp)
    want = np.mean(-keep * r * adv)
    want_grad = -keep * r * adv / lp.size
    loss, grad, m = _loss_and_grad("m2po", LP, OLD, ADV, m2_threshold=tau)
    assert loss == pytest.approx(want, abs=1e-12)
    assert np.allclose(grad, want_grad, atol=1e-12)
    assert float(m["masked_frac"]) == pytest.approx(1 - keep.mean())
    assert float(m["m2_kept"]) <= tau + 1e-9
    # squares .25 .01 0 .49 .04 .0025 (mean .132): at 0.04 dropping .49 and .25 leaves
    # .0525 / 4 = .013; at 0.005 dropping .04 too leaves .0125 / 3 = .0042; at 1.0 none
    assert int((1 - keep).sum()) == {0.04: 2, 0.005: 3, 1.0: 0}[tau]


def test_dppo_kl_is_prime_rls_default_loss():
    # probabilities: old 0.5 everywhere; new 0.8, 0.6 (A > 0) and 0.2, 0.45 (A < 0)
    p_old = np.full(4, 0.5)
    p_new = np.array([0.8, 0.6, 0.2, 0.45])
    adv = np.array([1.0, 1.0, -1.0, -1.0])
    diff = p_new - p_old  # [.3, .1, -.3, -.05]
    keep = np.array([0.0, 1.0, 0.0, 1.0])  # .3 > .2 with A > 0; -.3 < -.2 with A < 0
    assert (np.where(adv > 0, diff > 0.2, diff < -0.2) == (keep == 0)).all()
    log_r = np.log(p_new) - np.log(p_old)
    r = np.exp(log_r)
    kl_tau = 0.01
    want = np.mean(-keep * adv * r + kl_tau * log_r**2)
    want_grad = (-keep * adv * r + 2 * kl_tau * log_r) / 4
    loss, grad, m = _loss_and_grad(
        "dppo_kl",
        [np.log(p_new).tolist()],
        [np.log(p_old).tolist()],
        [adv.tolist()],
        kl_tau=kl_tau,
    )
    assert loss == pytest.approx(want, abs=1e-12)
    assert np.allclose(grad[0], want_grad, atol=1e-12)
    assert float(m["masked_frac"]) == pytest.approx(0.5)


YAML = """
algorithm:
  advantage: grpo
  policy_loss: {loss}
  options: {options}
"""


@pytest.mark.parametrize(
    ("loss", "options"),
    [
        ("cispo", {"eps_low_is": 0.5}),
        ("sapo", {"tau_pos": 0.9, "tau_neg": 1.2}),
        ("m2po", {"m2_threshold": 0.02}),
        ("dppo_kl", {"dppo_mask_low": 0.1, "kl_tau": 0.0}),
    ],
)
def test_each_loss_is_selected_from_yaml(tmp_path, loss, options):
    path = tmp_path / "run.yaml"
    path.write_text(YAML.format(loss=loss, options=options))
    cfg = load_config(path)
    obj = check_algorithm(objective_settings(cfg))
    assert obj.alg.policy_loss == loss
    for key, value in options.items():
        assert obj.loss_options[key] == value
    assert not set(options) & set(obj.advantage_options)


def test_cispo_takes_the_upper_clip_and_refuses_a_set_lower_one(tmp_path):
    cfg = load_config(None, ["algorithm.policy_loss=cispo", "algorithm.eps_high=4.0"])
    assert check_algorithm(objective_settings(cfg)).loss_options["eps_high"] == 4.0
    cfg = load_config(None, ["algorithm.policy_loss=cispo", "algorithm.eps_low=0.1"])
    with pytest.raises(ConfigError, match=r"algorithm\.eps_low is set but policy loss 'cispo'"):
        check_algorithm(objective_settings(cfg))
