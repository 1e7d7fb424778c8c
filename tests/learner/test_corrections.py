"""Learner with the chosen off-policy corrections, DAPO's overlong filter and REINFORCE++'s
KL-in-reward, on the tiny model; every new key acts or is rejected with a message."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from agentrl.errors import ConfigError, UnknownNameError
from agentrl.learner import Learner
from agentrl.run.settings import resolve
from agentrl.types import Batch, TrajectoryGroup, Turn
from tests.learner.conftest import make_cfg, make_groups


def _stale(fresh_model: Callable[[], torch.nn.Module], seed: int = 3) -> list[TrajectoryGroup]:
    """Groups sampled by a perturbed (older) policy at version 0."""
    old_policy = fresh_model()
    with torch.no_grad():
        for p in old_policy.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return make_groups(old_policy, seed=seed, version=0)


def _learner(fresh_model, **algorithm) -> Learner:
    learner = Learner(
        fresh_model(), None, resolve(make_cfg(algorithm=algorithm, learner={"lr": 1e-12})).learner
    )
    learner.version = 1  # the groups' tokens are one version behind
    return learner


def test_loglinear_with_one_update_is_the_recomputed_proximal_policy(fresh_model):
    """Before the step's first update pi_theta is pi_prox, so loglinear needs no pass."""
    stale = _stale(fresh_model)
    recompute = _learner(fresh_model, off_policy="decoupled")
    loglinear = _learner(fresh_model, off_policy="decoupled", proximal="loglinear")
    m_re, m_ll = recompute.step(stale), loglinear.step(stale)
    a, b = recompute.last_old_logprobs, loglinear.last_old_logprobs
    assert a is not None and b is not None and float(a.abs().sum()) > 0
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert m_ll["pg/is_weight_mean"] == pytest.approx(m_re["pg/is_weight_mean"], abs=1e-5)
    assert m_ll["pg/ratio_mean"] == pytest.approx(1.0, abs=1e-6)


def test_loglinear_interpolates_after_the_first_update(fresh_model):
    stale = _stale(fresh_model)
    learner = Learner(
        fresh_model(),
        None,
        resolve(
            make_cfg(
                algorithm={"off_policy": "decoupled", "proximal": "loglinear"},
                learner={"minibatches": 2, "lr": 1e-3},
            )
        ).learner,
    )
    learner.version = 1
    recomputed = learner.compute_logprobs(stale)
    batch = Batch.from_groups(stale)
    behaviour = batch.behavior_logprobs
    metrics = learner.step(stale)
    used = learner.last_old_logprobs
    assert used is not None
    mask = batch.loss_mask > 0
    gap = (used - recomputed).abs()[mask]
    # half the rows are exact (first update); the other half are approximations
    exact_rows = ((used - recomputed).abs() * batch.loss_mask).sum(dim=1) < 1e-3
    assert 0 < int(exact_rows.sum()) < len(exact_rows)
    assert float(gap.max()) < float((behaviour - recomputed).abs()[mask].max())
    assert metrics["learner/no_grad_passes"] == 0  # loglinear: no pi_prox forward
    assert all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize(
    ("options", "rejected"),
    [
        ({"is_mask": "token", "is_mask_low": 0.999, "is_mask_high": 1.001}, True),
        ({"is_mask": "token", "is_mask_low": 0.0, "is_mask_high": 1e6}, False),
        ({"is_mask": "geometric", "is_mask_low": 0.999, "is_mask_high": 1.001}, True),
    ],
)
def test_rejection_masks_act_in_the_learner(fresh_model, options, rejected):
    learner = _learner(fresh_model, off_policy="tis", **options)
    metrics = learner.step(_stale(fresh_model))
    assert (metrics["pg/is_rejected_frac"] > 0) == rejected
    assert all(math.isfinite(v) for v in metrics.values())


def test_is_mode_and_level_reach_the_loss(fresh_model):
    stale = _stale(fresh_model)
    m_mask = _learner(fresh_model, off_policy="tis", is_cap=1.0, is_mode="mask").step(stale)
    m_trunc = _learner(fresh_model, off_policy="tis", is_cap=1.0).step(stale)
    assert m_trunc["pg/is_weight_max"] == pytest.approx(1.0)
    assert m_mask["pg/is_weight_mean"] < m_trunc["pg/is_weight_mean"]  # zeros above the cap
    m_seq = _learner(fresh_model, off_policy="tis", is_level="sequence", is_cap=1e6).step(stale)
    assert m_seq["pg/is_weight_max"] != pytest.approx(m_trunc["pg/is_weight_max"])


def _truncate(groups: list[TrajectoryGroup]) -> tuple[list[TrajectoryGroup], int, int]:
    """Mark one sample per group truncated by a limit and one cut at max_new_tokens."""
    dropped_tokens = 0
    for g in groups:
        a, b = g.trajectories[0], g.trajectories[1]
        a.status = "truncated"
        b.turns = [Turn(index=0, finish_reason="length")]
        dropped_tokens += a.num_model_tokens + b.num_model_tokens
    return groups, 2 * len(groups), dropped_tokens


def test_overlong_filter_takes_truncated_samples_out_of_the_loss(fresh_model):
    groups, n_dropped, dropped_tokens = _truncate(make_groups(fresh_model(), seed=5))
    total = sum(t.num_model_tokens for g in groups for t in g.trajectories)
    cfg = make_cfg(algorithm={"overlong": {"filter": True}})
    metrics = Learner(fresh_model(), None, resolve(cfg).learner).step(groups)
    assert metrics["overlong_filtered"] == n_dropped
    assert metrics["tokens/trained"] == total - dropped_tokens
    off = Learner(fresh_model(), None, resolve(make_cfg()).learner).step(groups)
    assert off["tokens/trained"] == total and "overlong_filtered" not in off


def test_filtered_rows_get_no_gradient(fresh_model):
    """A step whose only trainable rows are truncated leaves the weights untouched."""
    groups, _, _ = _truncate(make_groups(fresh_model(), n_groups=1, group_size=2, seed=6))
    learner = Learner(
        fresh_model(), None, resolve(make_cfg(algorithm={"overlong": {"filter": True}})).learner
    )
    before = [p.detach().clone() for p in learner.model.parameters()]
    metrics = learner.step(groups)
    assert metrics["tokens/trained"] == 0
    assert all(torch.equal(a, p) for a, p in zip(before, learner.model.parameters(), strict=True))


def test_kl_in_reward_reinforce_pp(fresh_model):
    cfg = make_cfg(
        algorithm={"advantage": "reinforce_pp", "kl": "k3", "kl_coef": 0.1, "kl_in_reward": True}
    )
    learner = Learner(fresh_model(), None, resolve(cfg).learner)
    groups = make_groups(learner.model, seed=7)
    first = learner.step(groups)
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # the policy is still the reference
    second = learner.step(groups)
    assert second["kl"] > 0 and second["kl_reward_mean"] == pytest.approx(-0.1 * second["kl"])
    assert "loss/kl" not in second  # the KL is in the reward, not in the loss
    assert learner.ref_model is not None
    assert all(math.isfinite(v) for v in second.values())


def test_kl_in_reward_with_gae(fresh_model):
    cfg = make_cfg(
        algorithm={
            "advantage": "gae",
            "critic": True,
            "kl": "k1",
            "kl_coef": 0.05,
            "kl_in_reward": True,
        }
    )
    learner = Learner(fresh_model(), None, resolve(cfg).learner)
    groups = make_groups(learner.model, seed=8)
    learner.step(groups)
    metrics = learner.step(groups)
    assert "kl_reward_mean" in metrics and "loss/value" in metrics
    assert all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize(
    ("algorithm", "match"),
    [
        ({"kl_in_reward": True}, "algorithm.kl"),
        ({"kl_in_reward": True, "kl": "k3"}, "kl_coef > 0"),
        ({"kl_in_reward": True, "kl": "k3", "kl_coef": 0.1}, "reinforce_pp"),
        ({"is_mask": "token"}, "off_policy=tis or decoupled"),
        ({"is_mode": "mask"}, "no effect"),
        ({"is_level": "sequence"}, "no effect"),
        ({"off_policy": "tis", "proximal": "loglinear"}, "off_policy=decoupled"),
        ({"off_policy": "tis", "is_mask": "token", "is_mask_low": 6.0}, "is_mask_low"),
        ({"off_policy": "tis", "is_mask_high": 3.0}, "is_mask is not set"),
    ],
)
def test_new_keys_are_rejected_where_they_cannot_act(fresh_model, algorithm, match):
    with pytest.raises(ConfigError, match=match):
        Learner(fresh_model(), None, resolve(make_cfg(algorithm=algorithm)).learner)


def test_unknown_mask_name_suggests(fresh_model):
    with pytest.raises(UnknownNameError, match="geometric"):
        Learner(
            fresh_model(),
            None,
            resolve(make_cfg(algorithm={"off_policy": "tis", "is_mask": "geometrik"})).learner,
        )
