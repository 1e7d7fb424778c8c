"""Turn-aware credit in the learner: GiGPO end to end, declared inputs, registries from YAML."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from agentrl.algos import compute_advantages
from agentrl.config import load_config
from agentrl.errors import UnknownNameError
from agentrl.learner import Learner
from agentrl.learner.objective import Objective, turn_index
from agentrl.run.settings import resolve
from agentrl.types import Batch, Segment, Trajectory, TrajectoryGroup, Turn

from . import custom_registries
from .conftest import make_cfg, make_traj


def _with_turns(groups, seed=0):
    """Give every model segment a Turn with a state key (the first turn's shared by the
    group, later ones from a small set, so states recur) and a process reward."""
    rng = random.Random(seed)
    for g in groups:
        for t in g.trajectories:
            n = len(t.turn_spans)
            t.turns = [
                Turn(
                    index=k,
                    state="start" if k == 0 else f"cell{rng.randrange(2)}",
                    step_reward=rng.choice([0.0, 0.2]) if k < n - 1 else None,
                )
                for k in range(n)
            ]
    return groups


def _groups(model, seed=0):
    rng = random.Random(seed)
    groups = []
    for g in range(2):
        trajs = [
            make_traj(model, rng, reward=float(i % 2), turns=2, task_id=f"task{g}")
            for i in range(4)
        ]
        groups.append(TrajectoryGroup(task_id=f"task{g}", trajectories=trajs, group_id=f"g{g}"))
    return _with_turns(groups, seed)


def test_gigpo_trains_end_to_end_from_yaml(tmp_path, fresh_model, base_model):
    yaml = tmp_path / "gigpo.yaml"
    yaml.write_text(
        "algorithm:\n  advantage: gigpo\n  options: {omega: 0.5, step_gamma: 0.9}\n"
        "learner: {lr: 0.001, micro_batch_size: 3, bf16: 'off', device: cpu, fused_logprobs: 'off'}\n"
        "rollout: {max_tokens: 64}\n"
    )
    cfg = load_config(yaml)
    groups = _groups(base_model)
    model = fresh_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    learner = Learner(model, None, resolve(cfg).learner)
    metrics = learner.step(groups)
    assert all(v == v for v in metrics.values())  # no NaN
    changed = any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert changed

    # the learner's advantages are the hand-checked function's on the batch's turn inputs
    batch = Batch.from_groups(groups)
    obj = learner.objective
    adv, mask, _ = obj.advantages(batch, batch.rewards, None)
    direct = compute_advantages(
        "gigpo",
        batch.rewards,
        batch.group_index,
        valid=batch.valid,
        turn_rewards=batch.turn_rewards,
        turn_mask=batch.turn_mask,
        turn_states=batch.turn_states,
        turn_index=turn_index(batch.turn_ends, batch.loss_mask),
        omega=0.5,
        step_gamma=0.9,
    )
    assert torch.allclose(adv, direct * mask)
    # tokens of one turn share one advantage; the two turns of a row differ somewhere
    ti = turn_index(batch.turn_ends, batch.loss_mask)
    assert ((adv != 0) <= (ti >= 0)).all()
    per_turn_distinct = [
        len({round(float(a), 6) for a in adv[i][ti[i] == k]}) for i in range(8) for k in (0, 1)
    ]
    assert set(per_turn_distinct) == {1}


def test_dropping_step_rewards_changes_token_level_advantages(base_model):
    groups = _groups(base_model, seed=3)
    batch = Batch.from_groups(groups)
    cfg = make_cfg(algorithm={"advantage": "reinforce_pp"})
    with_steps = Objective(
        resolve(cfg).objective.algorithm, attribution="soft", norm_length=64, step_weight=1.0
    )
    without = Objective(
        resolve(cfg).objective.algorithm, attribution="soft", norm_length=64, step_weight=0.0
    )
    a1, _, _ = with_steps.advantages(batch, batch.rewards, None)
    a0, _, _ = without.advantages(batch, batch.rewards, None)
    assert batch.turn_rewards.abs().sum() > 0
    assert not torch.allclose(a1, a0)


def test_user_aggregation_attribution_and_coupled_loss_from_yaml(tmp_path, fresh_model, base_model):
    yaml = tmp_path / "custom.yaml"
    yaml.write_text(
        "algorithm:\n  agg: user-seq-sum\n  policy_loss: group_centred\n"
        "rollout:\n  max_tokens: 64\n  branching: {attribution: own-tokens-only}\n"
        "learner: {lr: 0.001, micro_batch_size: 3, bf16: 'off', device: cpu, minibatches: 2,"
        " fused_logprobs: 'off'}\n"
    )
    cfg = load_config(yaml)
    learner = Learner(fresh_model(), None, resolve(cfg).learner)
    assert learner.objective.couples_group
    custom_registries.SEEN_GROUPS.clear()
    calls = dict(custom_registries.CALLS)
    groups = _groups(base_model, seed=5)
    learner.step(groups)
    assert custom_registries.CALLS["agg"] > calls["agg"]
    # micro-batches of 3 rows never split a group of 4: each holds one whole group
    for seen in custom_registries.SEEN_GROUPS:
        assert set(Counter(seen).values()) == {4}

    # the attribution: a branch tree whose child shares the parent's first turn
    rng = random.Random(0)
    root = make_traj(base_model, rng, reward=1.0, turns=2, traj_id="root")
    pos = sum(len(s) for s in root.segments[:3])  # prompt, model, observation
    child_tail = Segment("model", [5, 6, 7], logprobs=[-1.0] * 3, versions=[0] * 3)
    child = Trajectory(
        segments=[*root.segments[:3], child_tail],
        reward=0.0,
        traj_id="child",
        parent_id="root",
        branch_position=pos,
    )
    batch = Batch.from_groups([TrajectoryGroup("t", [root, child])])
    _, mask, _ = learner.objective.advantages(batch, batch.rewards, None)
    assert custom_registries.CALLS["attribution"] > calls["attribution"]
    assert mask[1, :pos].sum() == 0 and mask[1, pos : pos + 3].sum() == 3


def test_unknown_registry_names_fail_naming_the_field():
    cfg = make_cfg(algorithm={"agg": "token-maen"})
    with pytest.raises(UnknownNameError, match=r"algorithm\.agg: .*did you mean 'token-mean'"):
        Objective(resolve(cfg).objective.algorithm, attribution="soft", norm_length=8)
    with pytest.raises(UnknownNameError, match=r"rollout\.branching\.attribution: .*'hard'"):
        Objective(resolve(make_cfg()).objective.algorithm, attribution="hadr", norm_length=8)


def test_adaptive_kl_beta_follows_the_last_steps_kl(base_model):
    cfg = make_cfg(
        algorithm={"policy_loss": "ppo_adaptive_kl", "options": {"kl_beta": 1.0, "kl_target": 0.01}}
    )
    obj = Objective(resolve(cfg).objective.algorithm, attribution="soft", norm_length=64)
    batch = Batch.from_groups(_groups(base_model))
    obj.advantages(batch, batch.rewards, None)
    assert obj.loss_options["kl_beta"] == 1.0
    mask = batch.loss_mask
    old = batch.behavior_logprobs
    for shift in (0.5, 0.5):  # a big policy change: KL far above the target
        obj.loss(
            old + shift * mask, None, None, mask=mask, old_logprobs=old, behavior_logprobs=old,
            advantages=torch.zeros_like(mask), ref_logprobs=None, old_values=None,
            returns=None, denominator=float(mask.sum()),
        )  # fmt: skip
    obj.advantages(batch, batch.rewards, None)
    assert obj.loss_options["kl_beta"] == 2.0
    obj.advantages(batch, batch.rewards, None)  # no loss seen since: kept
    assert obj.loss_options["kl_beta"] == 2.0


def test_gvpo_trains_with_a_reference_model_and_whole_groups(fresh_model, base_model):
    cfg = make_cfg(
        algorithm={"policy_loss": "gvpo", "agg": "seq-mean-token-mean", "options": {"beta": 0.1}},
        learner={"fused_logprobs": "off"},
    )
    model = fresh_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    learner = Learner(model, None, resolve(cfg).learner)
    assert learner.ref_model is not None and learner.objective.couples_group
    metrics = learner.step(_groups(base_model, seed=7))
    assert metrics["pg/gvpo_residual"] > 0
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_check_algorithm_names_a_bad_option_before_models_load():
    from agentrl.errors import ConfigError
    from agentrl.learner.objective import check_algorithm

    cfg = make_cfg(algorithm={"advantage": "gigpo", "options": {"omgea": 1.0}})
    with pytest.raises(ConfigError, match=r"algorithm\.options\.omgea.*did you mean 'omega'"):
        check_algorithm(resolve(cfg).objective)
    with pytest.raises(UnknownNameError, match=r"algorithm\.advantage: .*'gigpo'"):
        check_algorithm(resolve(make_cfg(algorithm={"advantage": "gipgo"})).objective)
