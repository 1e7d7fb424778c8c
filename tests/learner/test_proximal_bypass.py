"""The proximal bypass: on a synchronous one-update step whose sampler computes like the
learner, the start-of-step pass is skipped and the behaviour log-probs stand in for it; the
loss and gradients are then the ones the pass would have given. It is not taken where
the pass can change the result."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

from agentrl.config import Config
from agentrl.errors import ConfigError
from agentrl.learner import Learner
from agentrl.learner.precision import Precision
from agentrl.learner.proximal import bypass_blockers
from agentrl.run.settings import resolve
from agentrl.types import TrajectoryGroup
from tests.learner.conftest import make_cfg, make_groups

SYNC = {
    "orchestrator": {"max_staleness": 0},
    "model": {"name": "tiny-llama"},  # the hf sampler computes it in float32, as the learner
}


def _cfg(algorithm: dict | None = None, learner: dict | None = None, **sections: dict) -> Config:
    merged = {**copy.deepcopy(SYNC), **sections}
    algorithm = {"off_policy": "tis", **(algorithm or {})}
    return make_cfg(algorithm=algorithm, learner=learner or {}, **merged)


def _own_logprob_groups(learner: Learner, groups: list[TrajectoryGroup]) -> list[TrajectoryGroup]:
    """`groups` with behaviour log-probs replaced by the learner's own (its no-grad pass,
    the same forward the step would recompute), so both paths see equal numbers."""
    groups = copy.deepcopy(groups)
    lp = learner.compute_logprobs(groups)
    trajs = [t for g in groups for t in g.trajectories]
    for row, traj in zip(lp, trajs, strict=True):
        pos = 0
        for seg in traj.segments:
            n = len(seg.token_ids)
            if seg.kind == "model":
                seg.logprobs = row[pos : pos + n].tolist()
            pos += n
    return groups


def _step_with_grads(learner: Learner, groups) -> tuple[dict[str, float], list[torch.Tensor]]:
    """One step; the gradients each parameter had when the optimizer stepped."""
    grads: list[torch.Tensor] = []
    params = learner.trained_parameters()

    def record(*_: object) -> None:
        grads.extend(p.grad.detach().clone() for p in params)

    handle = learner.optimizer.register_step_pre_hook(record)
    try:
        return learner.step(groups), grads
    finally:
        handle.remove()


@pytest.mark.parametrize("off_policy", ["tis", "decoupled"])
def test_bypass_gives_the_loss_and_gradients_of_the_pass(
    fresh_model: Callable[[], torch.nn.Module], off_policy: str
) -> None:
    on = Learner(fresh_model(), None, resolve(_cfg({"off_policy": off_policy})).learner)
    off = Learner(
        fresh_model(),
        None,
        resolve(_cfg({"off_policy": off_policy, "proximal_bypass": "off"})).learner,
    )
    assert on.bypass_blockers == [] and off.bypass_blockers == ["algorithm.proximal_bypass=off"]
    groups = _own_logprob_groups(on, make_groups(fresh_model(), seed=11))
    m_on, g_on = _step_with_grads(on, groups)
    m_off, g_off = _step_with_grads(off, groups)
    assert m_on["learner/proximal_bypass"] == 1.0 and m_off["learner/proximal_bypass"] == 0.0
    assert m_on["learner/no_grad_passes"] == 0 and m_off["learner/no_grad_passes"] == 1
    assert m_on["loss/total"] == m_off["loss/total"] != 0.0
    assert m_on["loss/pg"] == m_off["loss/pg"]
    assert len(g_on) == len(g_off) > 0
    assert any(float(g.abs().sum()) > 0 for g in g_on)
    for a, b in zip(g_on, g_off, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(on.model.parameters(), off.model.parameters(), strict=True):
        assert torch.equal(a, b)
    # the gap metric is still there: measured on the update's own forward (train mode)
    assert m_on["logprob_gap/mean"] == pytest.approx(m_off["logprob_gap/mean"], abs=1e-5)
    assert m_on["entropy"] == pytest.approx(m_off["entropy"], rel=1e-5)


def test_bypass_holds_across_synchronous_steps(fresh_model: Callable[[], torch.nn.Module]) -> None:
    """Step 2 trains on tokens of version 1 (the weights after step 1): bypassed again;
    a batch with a token of an older version is not."""
    learner = Learner(fresh_model(), None, resolve(_cfg()).learner)
    assert learner.step(make_groups(fresh_model(), seed=12, version=0))["learner/proximal_bypass"]
    fresh = make_groups(learner.model, seed=13, version=1)
    assert learner.step(fresh)["learner/proximal_bypass"] == 1.0
    stale = make_groups(learner.model, seed=14, version=1)  # learner is at version 2 now
    metrics = learner.step(stale)
    assert metrics["learner/proximal_bypass"] == 0.0
    # pi_old comes from a no-grad pass, or (one update a step) from the update's forward
    assert metrics["learner/no_grad_passes"] + metrics["learner/proximal_current"] == 1


@pytest.mark.parametrize(
    ("sections", "blocker"),
    [
        ({"orchestrator": {"max_staleness": 1}}, "orchestrator.max_staleness=1"),
        ({"learner": {"ppo_epochs": 2}}, "2 optimizer updates per step"),
        ({"learner": {"minibatches": 2}}, "2 optimizer updates per step"),
        ({"algorithm": {"is_mask": "token"}}, "algorithm.is_mask=token"),
        ({"algorithm": {"off_policy": "none"}}, "algorithm.off_policy=none"),
        (
            {"algorithm": {"off_policy": "decoupled", "proximal": "loglinear"}},
            "proximal=loglinear",
        ),
        ({"model": {"name": "tiny-llama", "dtype": "bfloat16"}}, "sampler computes in"),
        ({"learner": {"bf16": "on"}}, "sampler computes in"),
        ({"sampler": {"backend": "vllm"}}, "sampler.backend=vllm"),
        ({"algorithm": {"advantage": "gae", "critic": True}}, "critic's values"),
    ],
)
def test_not_taken_where_the_pass_can_change_the_result(
    fresh_model: Callable[[], torch.nn.Module],
    sections: dict,
    blocker: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import agentrl.models

    # a CPU with bf16 instructions (without them both sides compute in float32)
    monkeypatch.setattr(agentrl.models, "cpu_supports_bf16", lambda: True)
    cfg = _cfg(
        sections.get("algorithm"),
        sections.get("learner"),
        **{k: v for k, v in sections.items() if k not in ("algorithm", "learner")},
    )
    learner = Learner(fresh_model(), None, resolve(cfg).learner)
    assert any(blocker in b for b in learner.bypass_blockers), learner.bypass_blockers
    if learner.precision.bf16 or sections.get("sampler"):
        return  # the step itself is the same code path; the blocker is what matters
    metrics = learner.step(make_groups(fresh_model(), seed=15, version=0))
    assert metrics["learner/proximal_bypass"] == 0.0


@pytest.mark.parametrize("native", [True, False], ids=["bf16-cpu", "no-bf16-cpu"])
def test_bf16_learner_and_bf16_sampler_may_bypass(native: bool, monkeypatch) -> None:
    """Both compute in bf16, or (a CPU without bf16 instructions) both in float32."""
    import agentrl.models

    monkeypatch.setattr(agentrl.models, "cpu_supports_bf16", lambda: native)
    cfg = _cfg(model={"name": "tiny-llama", "dtype": "bfloat16"}, learner={"bf16": "on"})
    precision = Precision.from_settings(resolve(cfg).learner.train)
    assert bypass_blockers(resolve(cfg).learner, precision) == []


def test_bypass_off_under_no_correction_is_a_config_error(
    fresh_model: Callable[[], torch.nn.Module],
) -> None:
    with pytest.raises(ConfigError, match="proximal_bypass"):
        Learner(
            fresh_model(),
            None,
            resolve(_cfg({"off_policy": "none", "proximal_bypass": "off"})).learner,
        )


# --- one update per step, stale tokens: the update's own forward gives pi_old -------------

ASYNC = {"orchestrator": {"max_staleness": 1}}


@pytest.mark.parametrize("off_policy", ["tis", "decoupled"])
def test_one_update_on_stale_tokens_takes_pi_old_from_its_own_forward(
    fresh_model: Callable[[], torch.nn.Module], off_policy: str
) -> None:
    """Tokens one version old (an asynchronous run): the behaviour log-probs are not pi_old,
    but the weights the step starts with are the ones its single update differentiates, so
    the update's own detached log-probs are pi_old and the pass is skipped. Loss, importance
    weights and every gradient match the run that makes the pass."""
    cfg_on = _cfg({"off_policy": off_policy}, **ASYNC)
    cfg_off = _cfg({"off_policy": off_policy, "proximal_bypass": "off"}, **ASYNC)
    on, off = (
        Learner(fresh_model(), None, resolve(cfg_on).learner),
        Learner(fresh_model(), None, resolve(cfg_off).learner),
    )
    assert on.current_blockers == [] and on.bypass_blockers
    assert off.current_blockers == ["algorithm.proximal_bypass=off"]
    for learner in (on, off):  # one step first, so the batch below is a version old
        learner.step(make_groups(fresh_model(), seed=20, version=0))
    # sampled by the version-0 weights (fresh_model), trained at version 1
    stale = make_groups(fresh_model(), seed=21, version=0, temperature=1.0)
    m_on, g_on = _step_with_grads(on, stale)
    m_off, g_off = _step_with_grads(off, stale)
    assert m_on["learner/proximal_current"] == 1.0 and m_on["learner/proximal_bypass"] == 0.0
    assert m_off["learner/proximal_current"] == 0.0
    assert m_on["learner/no_grad_passes"] == 0 and m_off["learner/no_grad_passes"] == 1
    # the importance weights pi_old / pi_behave are not 1: the tokens are stale
    assert m_off["pg/is_weight_mean"] != pytest.approx(1.0, abs=1e-6)
    for key in ("loss/total", "loss/pg", "pg/is_weight_mean", "logprob_gap/mean"):
        assert m_on[key] == pytest.approx(m_off[key], rel=1e-5, abs=1e-7), key
    assert m_on["loss/total"] != 0.0
    assert len(g_on) == len(g_off) > 0 and any(float(g.abs().sum()) > 0 for g in g_on)
    for a, b in zip(g_on, g_off, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    # pi_old the loss used: the recomputed log-probs, to rounding
    torch.testing.assert_close(on.last_old_logprobs, off.last_old_logprobs, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("sections", "blocker"),
    [
        ({"learner": {"ppo_epochs": 2}}, "2 optimizer updates per step"),
        ({"algorithm": {"advantage": "gae", "critic": True}}, "critic's values"),
        ({"algorithm": {"proximal_bypass": "off"}}, "proximal_bypass=off"),
    ],
)
def test_own_forward_not_taken_where_it_is_not_pi_old(
    fresh_model: Callable[[], torch.nn.Module], sections: dict, blocker: str
) -> None:
    cfg = _cfg(
        {**{"off_policy": "tis"}, **sections.get("algorithm", {})},
        sections.get("learner"),
        **ASYNC,
    )
    learner = Learner(fresh_model(), None, resolve(cfg).learner)
    assert any(blocker in b for b in learner.current_blockers), learner.current_blockers
    metrics = learner.step(make_groups(fresh_model(), seed=22, version=0))
    assert metrics["learner/proximal_current"] == 0.0
    assert metrics["learner/no_grad_passes"] == 1  # the pi_prox forward ran


def test_own_forward_not_taken_under_dropout(fresh_model: Callable[[], torch.nn.Module]) -> None:
    """With dropout the update's forward (train mode) is not the pass's (eval mode)."""
    model = fresh_model()
    model.config.attention_dropout = 0.1
    learner = Learner(model, None, resolve(_cfg(**ASYNC)).learner)
    assert any("attention_dropout" in b for b in learner.current_blockers)
