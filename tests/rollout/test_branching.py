"""ARPO branching: tree shape, shared prefixes, budget, entropy rule, soft vs hard."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algos import tree_advantages, tree_from_ids
from agentrl.config import BranchingConfig, Config, RolloutConfig, SamplerConfig
from agentrl.rollout import RolloutEngine, check_shared_prefixes, decide_branch
from agentrl.run.settings import rollout_settings
from agentrl.types import Batch, Segment, Trajectory, TrajectoryGroup

from .scripted import ScriptedToolEnv

pytestmark = pytest.mark.anyio

K = 6  # entropy window used in these tests


def _engine(sampler, renderer, tool_turns=3, **branching):
    cfg = RolloutConfig(
        concurrency=16,
        max_turns=6,
        max_tokens=400,
        branching={"enabled": True, "entropy_window": K, **branching},
    )
    env = ScriptedToolEnv(tool_turns=tool_turns)
    return RolloutEngine(
        env,
        sampler,
        renderer,
        rollout_settings(Config(rollout=cfg, sampler=SamplerConfig(max_new_tokens=10))),
    )


def _ln_v(sampler) -> float:
    return math.log(sampler.vocab_size)


def _mean(xs):
    return sum(xs) / len(xs)


async def test_tree_shape_shared_prefix_and_budget(sampler, renderer):
    engine = _engine(
        sampler, renderer, budget=7, initial=2, branches=2, mode="threshold", alpha=1.0, tau=0.5
    )
    groups = await engine.collect(2)
    for g in groups:
        trajs = g.trajectories
        assert len(trajs) == 7  # exactly the budget M
        assert g.is_tree
        by_id = {t.traj_id: t for t in trajs}
        roots = [t for t in trajs if t.parent_id is None]
        assert len(roots) == 2  # N initial samples; always-branch never needs a top-up
        stats = g.metadata["arpo"]
        assert stats["top_up"] == 0 and stats["branched"] == 5
        for t in trajs:
            assert t.status == "ok", t.error
            for point in t.metadata.get("branch_points", []):
                assert point["branch"] and len(point["children"]) <= 2
            if t.parent_id is None:
                continue
            parent = by_id[t.parent_id]
            n = t.branch_position
            # the branch starts right after a tool result of its parent
            ends = {
                sum(len(s) for s in parent.segments[: i + 1]): s.kind
                for i, s in enumerate(parent.segments)
            }
            assert ends[n] == "observation"
            # the shared prefix is the very same Segment objects (ids, logprobs, versions)
            k = next(
                i for i in range(len(t.segments) + 1) if sum(len(s) for s in t.segments[:i]) == n
            )
            assert all(a is b for a, b in zip(t.segments[:k], parent.segments[:k], strict=True))
            assert t.metadata["replay_mismatches"] == 0  # the env replay reproduced the prefix
            assert t.input_ids[n:] != parent.input_ids[n:]
            assert t.traj_id in next(
                p["children"] for p in parent.metadata["branch_points"] if p["position"] == n
            )
        check_shared_prefixes(g)
    assert ScriptedToolEnv.open_instances == set()


async def test_entropy_after_the_current_tool_result_drives_the_decision(sampler, renderer):
    # threshold rule alpha + beta*dH > tau with alpha = tau = 0: branch exactly when dH > 0
    engine = _engine(
        sampler,
        renderer,
        budget=12,
        initial=3,
        branches=1,
        mode="threshold",
        alpha=0.0,
        beta=1.0,
        tau=0.0,
    )
    (g,) = await engine.collect(1)
    ln_v = _ln_v(sampler)
    points = 0
    for t in g.trajectories:
        model = [s for s in t.segments if s.kind == "model"]
        h_init = _mean(model[0].entropies[:K])
        starts = {}
        pos = 0
        for s in t.segments:
            starts[pos] = s
            pos += len(s)
        for p in t.metadata.get("branch_points", []):
            seg = starts[p["position"]]  # the turn generated right after THIS tool result
            assert seg.kind == "model"
            h_post = _mean(seg.entropies[:K]) / ln_v
            assert p["h_post"] == pytest.approx(h_post, abs=1e-9)
            assert p["delta_h"] == pytest.approx(h_post - h_init / ln_v, abs=1e-9)
            budget_left = bool(p["children"]) or not p["branch"]
            assert p["branch"] == (p["delta_h"] > 0)
            assert budget_left or len(g.trajectories) == 12
            points += 1
    assert points >= 6
    assert len(g.trajectories) == 12


async def test_no_branching_tops_up_with_fresh_samples(sampler, renderer):
    engine = _engine(sampler, renderer, budget=5, initial=2, mode="threshold", alpha=-10.0)
    (g,) = await engine.collect(1)
    assert len(g.trajectories) == 5
    assert all(t.parent_id is None for t in g.trajectories)
    assert g.metadata["arpo"] == {
        "branch_points": g.metadata["arpo"]["branch_points"],
        "branched": 0,
        "top_up": 3,
    }
    assert not g.is_tree


async def test_stochastic_probability_is_clamped_and_state_is_per_group(sampler, renderer):
    engine = _engine(
        sampler, renderer, budget=4, initial=2, branches=3, mode="stochastic", alpha=0.5, beta=0.0
    )
    groups = await engine.collect(3)
    for g in groups:
        assert len(g.trajectories) == 4
        s = g.metadata["arpo"]
        assert 2 + s["branched"] + s["top_up"] == 4  # the budget is per group, never carried over
        for t in g.trajectories:
            for p in t.metadata.get("branch_points", []):
                assert p["p"] == 0.5


def test_branch_policy_rule():
    import random

    rng = random.Random(0)
    sto = BranchingConfig(alpha=0.2, beta=0.5, mode="stochastic")
    assert decide_branch(sto, 10.0, rng) == (True, 1.0)  # clamp to 1
    assert decide_branch(sto, -10.0, rng) == (False, 0.0)  # clamp to 0
    thr = BranchingConfig(alpha=0.2, beta=0.5, tau=0.5, mode="threshold")
    assert decide_branch(thr, 0.61, rng)[0] and not decide_branch(thr, 0.59, rng)[0]
    with pytest.raises(ValueError, match="initial"):
        BranchingConfig(budget=2, initial=3)


def _seg_model(ids, lp=-1.0, v=0):
    return Segment("model", ids, logprobs=[lp] * len(ids), versions=[v] * len(ids))


def test_soft_vs_hard_attribution_on_a_hand_built_tree():
    # R: prompt 0-2, model 3-4, obs 5-6, model 7-8, obs 9-10, model 11
    # A branches from R at 7: model 7-8, obs 9-10, model 11-12
    # B branches from A at 11: model 11-13
    prompt, m1, o1 = (
        Segment("prompt", [1, 2, 3]),
        _seg_model([4, 5]),
        Segment("observation", [6, 7]),
    )
    r_m2, r_o2, r_m3 = _seg_model([8, 9]), Segment("observation", [10, 11]), _seg_model([12])
    a_m2, a_o2, a_m3 = _seg_model([20, 21]), Segment("observation", [10, 11]), _seg_model([22, 23])
    b_m3 = _seg_model([30, 31, 32])
    R = Trajectory([prompt, m1, o1, r_m2, r_o2, r_m3], traj_id="R", reward=1.0)
    A = Trajectory(
        [prompt, m1, o1, a_m2, a_o2, a_m3], traj_id="A", parent_id="R", branch_position=7
    )
    B = Trajectory(
        [prompt, m1, o1, a_m2, a_o2, b_m3], traj_id="B", parent_id="A", branch_position=11
    )
    group = TrajectoryGroup("task", [R, A, B], group_id="g")
    check_shared_prefixes(group)
    batch = Batch.from_groups([group])
    rows = batch.trajectories  # the tree index of a batch, as the learner builds it
    parent, branch_pos = tree_from_ids(
        [t.traj_id for t in rows], [t.parent_id for t in rows], [t.branch_position for t in rows]
    )
    assert parent.tolist() == [-1, 0, 1]
    assert branch_pos.tolist() == [0, 7, 11]
    adv = torch.tensor([1.0, -1.0, 2.0])

    soft = tree_advantages("soft", adv, parent, branch_pos, batch.loss_mask, batch.input_ids)
    assert torch.equal(soft.loss_mask, batch.loss_mask)  # every leaf trains its whole path
    for row, a in enumerate(adv.tolist()):
        on = batch.loss_mask[row] > 0
        assert torch.all(soft.advantages[row][on] == a)

    hard = tree_advantages("hard", adv, parent, branch_pos, batch.loss_mask, batch.input_ids)
    trained = {row: hard.loss_mask[row].nonzero().flatten().tolist() for row in range(3)}
    assert trained == {0: [3, 4, 7, 8, 11], 1: [7, 8, 11, 12], 2: [11, 12, 13]}
    expect = {
        (0, 3): 2 / 3,
        (0, 4): 2 / 3,  # shared by R, A, B: trained once with their mean
        (0, 7): 1.0,
        (0, 8): 1.0,
        (0, 11): 1.0,
        (1, 7): 0.5,
        (1, 8): 0.5,  # shared by A and B
        (1, 11): -1.0,
        (1, 12): -1.0,
        (2, 11): 2.0,
        (2, 12): 2.0,
        (2, 13): 2.0,
    }
    for (row, t), value in expect.items():
        assert hard.advantages[row, t].item() == pytest.approx(value)
    # every shared model token is trained exactly once under hard, once per leaf under soft
    assert int(hard.loss_mask.sum()) == 12 and int(soft.loss_mask.sum()) == 5 + 6 + 7


async def test_branches_of_a_stateful_python_session_replay_the_prefix(sampler, renderer):
    from .scripted import SandboxPythonEnv

    cfg = RolloutConfig(
        concurrency=8,
        max_turns=5,
        max_tokens=400,
        branching={
            "enabled": True,
            "budget": 5,
            "initial": 1,
            "branches": 2,
            "mode": "threshold",
            "alpha": 1.0,
            "entropy_window": K,
        },
    )
    env = SandboxPythonEnv(tool_turns=3)
    engine = RolloutEngine(
        env,
        sampler,
        renderer,
        rollout_settings(Config(rollout=cfg, sampler=SamplerConfig(max_new_tokens=6))),
    )
    (g,) = await engine.collect(1)
    assert len(g.trajectories) == 5 and g.is_tree
    for t in g.trajectories:
        assert t.status == "ok", t.error
        # x = 1, then x + 1 twice: a branch sees x from the replayed session, not a fresh one
        assert [c.result for turn in t.turns for c in turn.tool_calls] == ["1", "2", "3"]
        if t.parent_id is not None:
            assert t.metadata["replay_mismatches"] == 0
    check_shared_prefixes(g)
