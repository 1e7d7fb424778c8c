"""`agentrl eval`'s per-task scores come from agentrl.algos' pass@k and maj@k."""

from __future__ import annotations

import pytest

from agentrl.algos import maj_at_k, pass_at_k
from agentrl.run.evaluation import average_scores, group_scores
from agentrl.types import Trajectory, TrajectoryGroup


def _group(samples: list[tuple[str | None, float]], infra: int = 0) -> TrajectoryGroup:
    trajs = [
        Trajectory(reward=r, reward_info={} if a is None else {"extracted": a}, traj_id=str(i))
        for i, (a, r) in enumerate(samples)
    ]
    trajs += [Trajectory(status="infra_error", traj_id=f"x{i}") for i in range(infra)]
    return TrajectoryGroup("t", trajs)


def test_scores_match_the_algos_functions():
    g = _group([(" 42 ", 1.0), ("41", 0.0), ("42", 1.0), (None, 0.0), ("41", 0.0)], infra=2)
    scores = group_scores(g, [1, 2, 8])
    assert set(scores) == {"pass@1", "pass@2", "maj@5", "mean_reward"}  # k=8 > n=5 skipped
    assert scores["pass@1"] == pytest.approx(pass_at_k(5, 2, 1))
    assert scores["pass@2"] == pytest.approx(pass_at_k(5, 2, 2))
    assert scores["maj@5"] == maj_at_k(["42", "41", "42", None, "41"], "42") == 1.0
    assert scores["mean_reward"] == pytest.approx(0.4)


def test_majority_is_judged_by_the_verifier():
    # the verifier accepted "4" and "4.0"; the majority "4.0" is right though != "4"
    assert (
        group_scores(_group([("4", 1.0), ("4.0", 1.0), ("4.0", 1.0), ("5", 0.0)]), [1])["maj@4"]
        == 1.0
    )
    assert group_scores(_group([("5", 0.0), ("5", 0.0), ("4", 1.0)]), [1])["maj@3"] == 0.0
    assert group_scores(_group([(None, 1.0), (None, 0.0)]), [1])["maj@2"] == 0.0
    assert group_scores(_group([], infra=3), [1]) == {}


def test_a_task_with_failed_samples_is_averaged_over_what_it_has():
    # 4 samples asked: task a lost 2 to infrastructure, task b all 4; a failed sample is not a
    # wrong answer, so a's missing pass@4 is not a zero and b counts for nothing
    a = group_scores(_group([("8", 0.0), ("7", 1.0)], infra=2), [1, 2, 4])
    b = group_scores(_group([], infra=4), [1, 2, 4])
    c = group_scores(_group([("7", 1.0), ("7", 1.0), ("9", 0.0), ("7", 1.0)]), [1, 2, 4])
    out = average_scores([a, b, c], samples=4)
    assert out["tasks_scored"] == 2
    assert out["pass@1"] == pytest.approx((0.5 + 0.75) / 2)
    assert out["pass@4"] == pytest.approx(1.0)  # only c has 4 valid samples
    assert out["maj@4"] == pytest.approx((0.0 + 1.0) / 2)  # a's tie goes to its first, "8"
    assert not any(k.startswith("maj@") and k != "maj@4" for k in out)
