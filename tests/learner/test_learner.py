"""Learner on the tiny model: every algorithm trains, corrections, masking, exactness."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import pytest
import torch

from agentrl.algos import (
    ADVANTAGES,
    POLICY_LOSSES,
    Registry,
    register_advantage,
    register_policy_loss,
)
from agentrl.errors import ConfigError, UnknownNameError
from agentrl.learner import Learner, LearnerLike, ValueModel
from agentrl.run.settings import resolve
from agentrl.types import Batch, Segment, Trajectory, TrajectoryGroup
from tests.close import assert_trained_alike
from tests.learner.conftest import hf_logprobs, make_cfg, make_groups, make_traj

CORE_METRICS = (
    "loss/pg",
    "loss/entropy",
    "loss/total",
    "entropy",
    "pg/clip_frac",
    "pg/approx_kl",
    "grad_norm",
    "logprob_gap/mean",
    "is_ratio/mean",
    "staleness/mean",
    "response_length/mean",
    "reward/mean",
    "advantage/mean",
    "advantage/std",
    "tokens/trained",
    "lr",
    "version",
)

ALGORITHMS: dict[str, dict] = {
    "grpo": {"advantage": "grpo"},
    "dr_grpo": {"advantage": "dr_grpo", "agg": "seq-mean-token-sum-norm"},
    "rloo": {"advantage": "rloo", "agg": "seq-mean-token-mean"},
    "reinforce_pp": {"advantage": "reinforce_pp", "kl": "k3", "kl_coef": 0.05},
    "reinforce_pp_baseline": {"advantage": "reinforce_pp_baseline"},
    "gspo": {
        "advantage": "grpo",
        "policy_loss": "gspo",
        "agg": "seq-mean-token-mean",
        "eps_low": 3e-4,
        "eps_high": 4e-4,
    },
    "gspo_token": {"advantage": "grpo", "policy_loss": "gspo_token", "eps_low": 3e-4},
    "dapo": {
        "advantage": "grpo",
        "eps_high": 0.28,
        "agg": "token-mean",
        "dynamic_sampling": True,
        "overlong": {"enabled": True, "max_len": 20, "cache_len": 8},
        "entropy_coef": 0.001,
    },
    "ppo_gae": {"advantage": "gae", "critic": True, "lam": 0.95, "vf_coef": 0.5},
}


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_algorithm_trains(
    name: str, fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> None:
    learner_cfg = {"ppo_epochs": 2, "minibatches": 2} if name == "ppo_gae" else {}
    cfg = make_cfg(algorithm=ALGORITHMS[name], learner=learner_cfg)
    learner = Learner(fresh_model(), None, resolve(cfg).learner)
    before = _flat(learner.model)
    for step in range(2):
        metrics = learner.step(groups)
        assert learner.version == step + 1
        missing = [k for k in CORE_METRICS if k not in metrics]
        assert not missing, f"{name}: missing metrics {missing}"
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        assert metrics["nonfinite_skipped"] == 0
    assert not torch.equal(before, _flat(learner.model)), f"{name}: weights did not change"
    assert metrics["tokens/trained"] == sum(
        t.num_model_tokens for g in groups for t in g.trajectories
    )
    if name == "ppo_gae":
        assert "loss/value" in metrics and "value/value_mean" in metrics
        assert metrics["optimizer_steps"] == 4
    if name == "reinforce_pp":
        assert "kl" in metrics and "loss/kl" in metrics
    if name == "dapo":
        assert metrics["overlong_penalty_mean"] < 0  # responses of 13-24 tokens vs L_max 20


def test_learner_logprobs_match_plain_hf_forward(
    fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> None:
    model = fresh_model()
    learner = Learner(model, None, resolve(make_cfg(sampler={"temperature": 0.7})).learner)
    lp = learner.compute_logprobs(groups)
    row = 0
    for g in groups:
        for t in g.trajectories:
            ref = torch.tensor(hf_logprobs(model, t.input_ids, temperature=0.7))
            mask = torch.tensor(t.loss_mask, dtype=torch.bool)
            n = t.num_tokens
            torch.testing.assert_close(lp[row, :n][mask], ref[mask], atol=1e-5, rtol=0)
            assert torch.all(lp[row, :n][~mask] == 0)
            row += 1


def test_first_step_gap_is_numerical_only(
    fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> None:
    learner = Learner(fresh_model(), None, resolve(make_cfg()).learner)
    metrics = learner.step(groups)
    assert metrics["logprob_gap/mean"] < 1e-4
    assert metrics["staleness/tokens_0"] == metrics["tokens/trained"]


@pytest.mark.parametrize("correction", ["none", "tis", "decoupled"])
def test_off_policy_corrections(
    correction: str, base_model: torch.nn.Module, fresh_model: Callable[[], torch.nn.Module]
) -> None:
    # behaviour log-probs from a different (older) policy: a real sampler/learner gap
    old_policy = fresh_model()
    with torch.no_grad():
        for p in old_policy.parameters():
            p.add_(0.02 * torch.randn_like(p))
    stale = make_groups(old_policy, seed=3, version=0)
    learner = Learner(
        fresh_model(), None, resolve(make_cfg(algorithm={"off_policy": correction})).learner
    )
    learner.version = 1  # these tokens are one version behind
    metrics = learner.step(stale)
    assert metrics["logprob_gap/mean"] > 1e-3
    assert metrics["staleness/tokens_1"] == metrics["tokens/trained"]
    assert "logprob_gap/staleness_1" in metrics
    if correction == "none":
        assert "pg/is_weight_mean" not in metrics
        assert metrics["pg/behavior_gap_mean"] == 0.0  # pi_old is the behaviour policy
    else:
        assert metrics["pg/is_weight_mean"] > 0 and metrics["pg/is_weight_max"] <= 2.0
        assert metrics["pg/behavior_gap_mean"] == pytest.approx(
            metrics["logprob_gap/mean"], rel=1e-4
        )
    assert all(math.isfinite(v) for v in metrics.values())


def test_decoupled_clips_against_proximal_policy(
    fresh_model: Callable[[], torch.nn.Module], base_model: torch.nn.Module
) -> None:
    """With decoupled PPO the first epoch's ratio is pi_theta/pi_prox == 1 exactly."""
    old_policy = fresh_model()
    with torch.no_grad():
        for p in old_policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    stale = make_groups(old_policy, seed=4)
    cfg = make_cfg(algorithm={"off_policy": "decoupled"}, learner={"lr": 1e-12})
    metrics = Learner(fresh_model(), None, resolve(cfg).learner).step(stale)
    assert metrics["pg/clip_frac"] == 0.0
    assert metrics["pg/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    cfg_none = make_cfg(algorithm={"off_policy": "none"}, learner={"lr": 1e-12})
    metrics_none = Learner(fresh_model(), None, resolve(cfg_none).learner).step(stale)
    assert metrics_none["pg/clip_frac"] > 0.0  # against the behaviour policy the ratio moves


def _swap_infra_row(groups: list[TrajectoryGroup], model: torch.nn.Module, seed: int):
    import random

    rng = random.Random(seed)
    out = []
    for g in groups:
        trajs = list(g.trajectories)
        bad = make_traj(model, rng, reward=100.0 * seed, status="infra_error", task_id=g.task_id)
        out.append(TrajectoryGroup(g.task_id, [*trajs[:2], bad, *trajs[2:]], group_id=g.group_id))
    return out


def test_infra_rows_contribute_no_gradient(
    fresh_model: Callable[[], torch.nn.Module],
    base_model: torch.nn.Module,
    groups: list[TrajectoryGroup],
) -> None:
    """Changing an infra_error row's tokens and reward changes nothing (loss or baseline)."""
    results = []
    for seed in (1, 2):
        learner = Learner(
            fresh_model(), None, resolve(make_cfg(algorithm={"advantage": "grpo"})).learner
        )
        metrics = learner.step(_swap_infra_row(groups, base_model, seed))
        results.append((_flat(learner.model), metrics))
    (w1, m1), (w2, m2) = results
    assert m1["samples/infra_masked"] == 2 and m1["samples/valid"] == 8
    torch.testing.assert_close(w1, w2, atol=1e-7, rtol=0)
    assert m1["loss/pg"] == pytest.approx(m2["loss/pg"], abs=1e-7)
    # and the masked run equals a run without the infra rows at all
    clean = Learner(fresh_model(), None, resolve(make_cfg(algorithm={"advantage": "grpo"})).learner)
    clean.step(groups)
    # another batch shape, another kernel order: alike as training goes, not bit for bit
    assert_trained_alike(w1, _flat(clean.model), _flat(fresh_model()))


def test_micro_batching_equals_one_big_batch(
    fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> None:
    """Accumulated micro-batch gradients equal the whole minibatch's (same loss, same norm)."""
    for agg in ("token-mean", "seq-mean-token-mean"):
        results = []
        for mbs in (1, 8):
            cfg = make_cfg(algorithm={"agg": agg}, learner={"micro_batch_size": mbs})
            results.append(Learner(fresh_model(), None, resolve(cfg).learner).step(groups))
        for m in results[1:]:
            assert m["grad_norm"] == pytest.approx(results[0]["grad_norm"], rel=1e-5), agg
            assert m["loss/total"] == pytest.approx(results[0]["loss/total"], rel=1e-5, abs=1e-7)


def test_separate_critic_model(
    fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> None:
    policy = fresh_model()
    critic = ValueModel.from_policy(policy)
    head_before = critic.head.proj.weight.detach().clone()
    cfg = make_cfg(algorithm={"advantage": "gae", "critic": True}, learner={"critic_lr": 1e-2})
    learner = Learner(policy, None, resolve(cfg).learner, critic=critic)
    metrics = learner.step(groups)
    assert learner.value_head is None
    assert not torch.equal(head_before, critic.head.proj.weight)
    assert math.isfinite(metrics["loss/value"])
    assert learner.optimizer.param_groups[1]["lr"] == pytest.approx(1e-2)


def test_branch_tree_groups_train(
    fresh_model: Callable[[], torch.nn.Module], base_model: torch.nn.Module
) -> None:
    import random

    rng = random.Random(5)
    root = make_traj(base_model, rng, reward=1.0, turns=2, traj_id="r")
    # a branch forks after the first observation: shares the prefix, new continuation
    n_prefix = sum(len(s) for s in root.segments[:3])
    tail_ids = [rng.randrange(3, 49152) for _ in range(6)]
    ids = root.input_ids[:n_prefix] + tail_ids
    lps = hf_logprobs(base_model, ids)
    branch = Trajectory(
        segments=[*root.segments[:3], Segment("model", tail_ids, lps[n_prefix:], [0] * 6)],
        reward=0.0,
        traj_id="b",
        parent_id="r",
        branch_position=n_prefix,
        task_id="t",
    )
    other = make_traj(base_model, rng, reward=0.0, traj_id="o")
    tree = TrajectoryGroup("t", [root, branch, other], group_id="t")
    assert tree.is_tree
    for attribution in ("soft", "hard"):
        cfg = make_cfg(rollout={"branching": {"attribution": attribution}})
        learner = Learner(fresh_model(), None, resolve(cfg).learner)
        metrics = learner.step([tree])
        shared = root.segments[1].token_ids
        total = sum(t.num_model_tokens for t in tree.trajectories)
        expected = total - len(shared) if attribution == "hard" else total
        assert metrics["tokens/trained"] == expected
        assert math.isfinite(metrics["loss/total"])


def _native_bf16(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    """Whether the CPU counts as having bf16 instructions (the outcome must not depend on
    the machine the suite runs on; torch's bf16 kernels compute the same either way)."""
    import agentrl.models

    monkeypatch.setattr(agentrl.models, "cpu_supports_bf16", lambda: native)


def test_bf16_autocast_step(
    fresh_model: Callable[[], torch.nn.Module],
    groups: list[TrajectoryGroup],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _native_bf16(monkeypatch, True)
    learner = Learner(fresh_model(), None, resolve(make_cfg(learner={"bf16": "on"})).learner)
    assert learner.bf16
    metrics = learner.step(groups)
    assert all(math.isfinite(v) for v in metrics.values())
    assert next(learner.model.parameters()).dtype == torch.float32  # fp32 master weights
    assert metrics["logprob_gap/mean"] < 0.1  # bf16 rounding only


def test_bf16_on_a_cpu_without_bf16_instructions_says_so_and_trains_in_float32(
    fresh_model: Callable[[], torch.nn.Module],
    groups: list[TrajectoryGroup],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _native_bf16(monkeypatch, False)
    with caplog.at_level("WARNING", logger="agentrl.learner.precision"):
        learner = Learner(fresh_model(), None, resolve(make_cfg(learner={"bf16": "on"})).learner)
    said = [r.getMessage() for r in caplog.records if "bf16 instructions" in r.getMessage()]
    assert len(said) == 1 and "float32" in said[0], said
    assert not learner.bf16 and learner.precision.compute_dtype == torch.float32
    auto = Learner(fresh_model(), None, resolve(make_cfg(learner={"bf16": "auto"})).learner)
    assert not auto.bf16
    assert math.isfinite(learner.step(groups)["loss/total"])


def test_state_dict_for_sampler_is_a_cpu_copy(
    fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> None:
    learner = Learner(fresh_model(), None, resolve(make_cfg()).learner)
    sd = learner.state_dict_for_sampler(dtype=torch.bfloat16)
    assert set(sd) == set(learner.model.state_dict())
    assert all(v.device.type == "cpu" and v.dtype == torch.bfloat16 for v in sd.values())
    snap = learner.state_dict_for_sampler()
    learner.step(groups)
    key = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(snap[key], learner.model.state_dict()[key])


def test_config_errors_name_the_field(fresh_model: Callable[[], torch.nn.Module]) -> None:
    with pytest.raises(ConfigError, match=r"algorithm\.critic=true"):
        Learner(fresh_model(), None, resolve(make_cfg(algorithm={"advantage": "gae"})).learner)
    with pytest.raises(ConfigError, match=r"algorithm\.advantage=gae"):
        Learner(fresh_model(), None, resolve(make_cfg(algorithm={"critic": True})).learner)
    with pytest.raises(UnknownNameError, match="did you mean 'grpo'"):
        Learner(fresh_model(), None, resolve(make_cfg(algorithm={"advantage": "grpoo"})).learner)
    with pytest.raises(ValueError, match="at least one TrajectoryGroup"):
        Learner(fresh_model(), None, resolve(make_cfg()).learner).step([])


def test_step_without_trainable_tokens_still_advances(
    fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> None:
    broken = [
        TrajectoryGroup(
            g.task_id,
            [Trajectory(t.segments, reward=t.reward, status="infra_error") for t in g.trajectories],
        )
        for g in groups
    ]
    learner = Learner(fresh_model(), None, resolve(make_cfg()).learner)
    before = _flat(learner.model)
    metrics = learner.step(broken)
    assert learner.version == 1
    assert metrics["tokens/trained"] == 0 and metrics["optimizer_steps"] == 0
    assert torch.equal(before, _flat(learner.model))


def _shared_prompt_groups(model: torch.nn.Module, seed: int = 3) -> list[TrajectoryGroup]:
    """Groups whose samples share one prompt per group, as real GRPO groups do."""
    groups = make_groups(model, n_groups=2, group_size=4, seed=seed)
    for g in groups:
        prompt = g.trajectories[0].segments[0]
        for t in g.trajectories:
            t.segments[0] = Segment("prompt", list(prompt.token_ids))
            ids = t.input_ids
            lps = hf_logprobs(model, ids)
            pos = 0
            for s in t.segments:
                if s.kind == "model":
                    s.logprobs = lps[pos : pos + len(s)]
                pos += len(s)
    return groups


@pytest.mark.parametrize("alg", [{"off_policy": "tis"}, {"advantage": "gae", "critic": True}])
def test_shared_prompt_forward_equals_the_plain_path(
    fresh_model: Callable[[], torch.nn.Module], base_model: torch.nn.Module, alg: dict
) -> None:
    """Forwarding a group's prompt once gives the same step as forwarding every row."""
    groups = _shared_prompt_groups(base_model)
    results, models, learners = [], [], []
    for share in (True, False):
        cfg = make_cfg(algorithm=alg, learner={"micro_batch_size": 4, "share_prompt": share})
        torch.manual_seed(0)  # the same value-head initialisation for both learners
        learner = Learner(fresh_model(), None, resolve(cfg).learner)
        results.append(learner.step(groups))
        models.append(learner.model)
        learners.append(learner)
    whole = Batch.from_groups(groups)
    shared_prompt = learners[0].layout(whole).shared_prompt
    assert shared_prompt is not None and int(shared_prompt.min()) > 0
    assert learners[1].layout(whole).shared_prompt is None
    assert results[0]["grad_norm"] == pytest.approx(results[1]["grad_norm"], rel=1e-4)
    assert results[0]["loss/total"] == pytest.approx(results[1]["loss/total"], rel=1e-4, abs=1e-6)
    # Adam's first update is about lr * sign(grad), which flips on near-zero gradients'
    # rounding, so compare the gradients of the two forward paths, not the updated weights
    learner = learners[1]
    batch = Batch.from_groups(groups[:1])
    prefix_len = int(learners[0].layout(batch).shared_prompt[0])
    learner.model.train()
    grads = []
    for P in (0, prefix_len):
        learner.optimizer.zero_grad()
        lp, ent, values = learner.forward(
            learner.model, batch.input_ids, batch.loss_mask,
            with_entropy=True, with_values=learner.use_critic, prefix_len=P,
        )  # fmt: skip
        loss = (lp * batch.loss_mask).sum() + (ent * batch.loss_mask).sum()
        if values is not None:
            loss = loss + (values * batch.loss_mask).sum()
        loss.backward()
        grads.append(
            torch.cat(
                [p.grad.flatten() for p in learner.trained_parameters() if p.grad is not None]
            )
        )
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-5)
    lp_shared = learners[0].compute_logprobs(groups)
    lp_plain = learners[1].compute_logprobs(groups)
    assert torch.allclose(lp_shared, lp_plain, atol=1e-4)


def test_attention_kernels_give_the_same_logprobs_and_gradients(
    fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> None:
    """``sdpa_backend`` picks a kernel, never a different function of the weights."""
    from agentrl.learner.precision import MATH_ATTENTION_MAX_TOKENS

    batch = Batch.from_groups(groups, pad_token_id=0)
    grads, lps = {}, {}
    for backend in ("torch", "math", "flash", "auto"):
        learner = Learner(
            fresh_model(), None, resolve(make_cfg(learner={"sdpa_backend": backend})).learner
        )
        learner.model.train()
        lp, _, _ = learner.forward(
            learner.model, batch.input_ids, batch.loss_mask, with_entropy=False, with_values=False
        )
        (lp * batch.loss_mask).sum().backward()
        lps[backend] = lp.detach()
        grads[backend] = torch.cat(
            [p.grad.flatten() for p in learner.trained_parameters() if p.grad is not None]
        )
    for backend in ("math", "flash", "auto"):
        torch.testing.assert_close(lps[backend], lps["torch"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(grads[backend], grads["torch"], atol=1e-5, rtol=1e-4)
    # auto: math for short CPU micro-batches, PyTorch's own dispatch beyond the bound
    learner = Learner(fresh_model(), None, resolve(make_cfg()).learner)
    limit = MATH_ATTENTION_MAX_TOKENS
    flash, math_ = torch.backends.cuda.flash_sdp_enabled, torch.backends.cuda.math_sdp_enabled
    with learner.precision.attention(limit):
        assert math_() and not flash()
    with learner.precision.attention(limit + 1):
        assert flash()


@pytest.fixture
def registered() -> Iterator[list[tuple[Registry, str]]]:
    """Names a test registers, removed again afterwards."""
    names: list[tuple[Registry, str]] = []
    yield names
    for registry, name in names:
        registry._fns.pop(name, None)


def test_options_reach_a_registered_policy_loss(
    fresh_model: Callable[[], torch.nn.Module],
    groups: list[TrajectoryGroup],
    registered: list[tuple[Registry, str]],
) -> None:
    # vanilla policy gradient (Williams 1992) scaled by an option: L_t = -scale * A_t * log pi
    @register_policy_loss("test_scaled_pg")
    def scaled_pg(logprobs, old_logprobs, advantages, mask, *, scale: float = 1.0):
        return -scale * advantages * logprobs, {"scale": scale}

    registered.append((POLICY_LOSSES, "test_scaled_pg"))
    losses = {}
    for scale in (1.0, 3.0):
        alg = {"policy_loss": "test_scaled_pg", "options": {"scale": scale, "eps": 1e-3}}
        learner = Learner(fresh_model(), None, resolve(make_cfg(algorithm=alg)).learner)
        assert learner.objective.loss_options == {"scale": scale}
        assert learner.objective.advantage_options == {"eps": 1e-3}  # grpo's option
        metrics = learner.step(groups)
        assert metrics["pg/scale"] == scale
        losses[scale] = metrics["loss/pg"]
    assert losses[3.0] == pytest.approx(3.0 * losses[1.0], rel=1e-5)


def test_options_no_selected_function_takes_are_config_errors(
    fresh_model: Callable[[], torch.nn.Module],
) -> None:
    with pytest.raises(ConfigError) as exc:
        Learner(fresh_model(), None, resolve(make_cfg(algorithm={"options": {"esp": 0.1}})).learner)
    msg = str(exc.value)
    assert "algorithm.options.esp" in msg and "did you mean 'eps'" in msg
    assert "advantage 'grpo' takes eps, norm_by_std" in msg
    assert "policy loss 'ppo' takes no options" in msg
    # a GAE option with a group estimator does nothing, so it is refused too
    with pytest.raises(ConfigError, match=r"algorithm\.options\.whiten_advantages"):
        alg = {"options": {"whiten_advantages": False}}
        Learner(fresh_model(), None, resolve(make_cfg(algorithm=alg)).learner)
    # what the learner passes itself is set by its own field, not through options
    with pytest.raises(ConfigError, match=r"set algorithm\.eps_high instead"):
        Learner(
            fresh_model(), None, resolve(make_cfg(algorithm={"options": {"eps_high": 0.3}})).learner
        )
    with pytest.raises(ConfigError, match=r"algorithm\.options\.mask.*passed by the learner"):
        Learner(
            fresh_model(), None, resolve(make_cfg(algorithm={"options": {"mask": None}})).learner
        )


def test_clip_settings_reach_only_losses_that_take_them(
    fresh_model: Callable[[], torch.nn.Module],
    groups: list[TrajectoryGroup],
    registered: list[tuple[Registry, str]],
) -> None:
    @register_policy_loss("test_plain_pg")
    def plain_pg(logprobs, old_logprobs, advantages, mask):
        return -advantages * logprobs, {}

    registered.append((POLICY_LOSSES, "test_plain_pg"))
    learner = Learner(
        fresh_model(), None, resolve(make_cfg(algorithm={"policy_loss": "test_plain_pg"})).learner
    )
    assert learner.objective.loss_options == {}
    assert math.isfinite(learner.step(groups)["loss/pg"])
    with pytest.raises(ConfigError, match=r"algorithm\.eps_low is set but policy loss"):
        alg = {"policy_loss": "test_plain_pg", "eps_low": 0.1}
        Learner(fresh_model(), None, resolve(make_cfg(algorithm=alg)).learner)


def test_a_registered_critic_estimator_trains_a_value_function(
    fresh_model: Callable[[], torch.nn.Module],
    groups: list[TrajectoryGroup],
    registered: list[tuple[Registry, str]],
) -> None:
    """The learner asks the registry whether an estimator needs a critic; GAE is not special."""
    from agentrl.algos import compute_gae, place_outcome_rewards

    # TD(0) advantages (GAE with lambda = 0, Schulman et al. 2016, eq. 17), not whitened
    @register_advantage("test_td0", needs_critic=True)
    def td0(rewards, group_ids, *, valid, values, mask, gamma, lam):
        m = mask * valid[:, None]
        return compute_gae(place_outcome_rewards(rewards, m), values, m, gamma, 0.0)

    registered.append((ADVANTAGES, "test_td0"))
    with pytest.raises(ConfigError, match=r"algorithm\.advantage=test_td0 needs a value function"):
        Learner(fresh_model(), None, resolve(make_cfg(algorithm={"advantage": "test_td0"})).learner)
    cfg = make_cfg(algorithm={"advantage": "test_td0", "critic": True})
    learner = Learner(fresh_model(), None, resolve(cfg).learner)
    assert learner.use_critic and learner.value_head is not None
    metrics = learner.step(groups)
    assert math.isfinite(metrics["loss/value"]) and "value/value_mean" in metrics


def test_learner_and_learner_process_are_learner_like(
    fresh_model: Callable[[], torch.nn.Module],
) -> None:
    from agentrl.run.placement.learner_process import LearnerProcess

    learner = Learner(fresh_model(), None, resolve(make_cfg()).learner)
    assert isinstance(learner, LearnerLike)
    learner.close()  # nothing to release; callers close every learner the same way
    methods = ("step", "state_dict_for_sampler", "save_checkpoint", "load_checkpoint", "close")
    for name in methods:
        assert callable(getattr(LearnerProcess, name)), name


def test_gradient_checkpointing_recomputes_under_bf16_autocast(
    fresh_model: Callable[[], torch.nn.Module],
    groups: list[TrajectoryGroup],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """model.gradient_checkpointing under bf16 autocast: each layer's recompute in backward
    runs the attention kernel its forward ran (else it saves other tensors and checkpointing
    refuses), and the step's gradients are those without checkpointing."""
    _native_bf16(monkeypatch, True)

    def run(checkpointing: bool) -> tuple[Learner, dict[str, float]]:
        cfg = make_cfg(
            model={"gradient_checkpointing": checkpointing},
            learner={"lr": 1e-2, "bf16": "on"},
        )
        lrn = Learner(fresh_model(), None, resolve(cfg).learner)
        return lrn, lrn.step(groups)

    kept, m_kept = run(False)
    recomputed, m_recomputed = run(True)
    assert recomputed.model.is_activation_checkpointing
    assert m_recomputed["loss/total"] == pytest.approx(m_kept["loss/total"], abs=1e-6)
    assert m_recomputed["grad_norm"] == pytest.approx(m_kept["grad_norm"], rel=1e-4)
    for a, b in zip(kept.model.parameters(), recomputed.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_a_non_finite_loss_skips_the_update_and_is_counted(
    fresh_model: Callable[[], torch.nn.Module], base_model: torch.nn.Module
) -> None:
    """Finiteness is checked once per update, on the gradient norm (no host sync per
    micro-batch): a NaN reaching the loss leaves the weights as they were."""
    groups = make_groups(base_model, n_groups=2, seed=7)
    groups[1].trajectories[0].reward = float("nan")
    learner = Learner(
        fresh_model(), None, resolve(make_cfg(learner={"micro_batch_size": 2})).learner
    )
    before = _flat(learner.model).clone()
    metrics = learner.step(groups)
    assert metrics["nonfinite_skipped"] == 1 and metrics["optimizer_steps"] == 0
    torch.testing.assert_close(_flat(learner.model), before, atol=0, rtol=0)
