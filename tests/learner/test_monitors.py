"""The monitor/* metrics of a batch, and the run's length drift and alerts."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.learner.monitors import batch_monitors, mismatch_stats, repetition, skewness
from agentrl.learner.settings import MonitorSettings
from agentrl.run.events import AlertFired, EventBus
from agentrl.run.monitors import RunMonitor
from agentrl.types import Batch, Segment, Trajectory, TrajectoryGroup


def test_repetition_counts_repeated_ngrams() -> None:
    assert repetition([1, 2, 3, 4, 5, 6], 2) == 0.0
    # bigrams 12 23 31 12 23 31 12: 3 distinct of 7
    assert repetition([1, 2, 3, 1, 2, 3, 1, 2], 2) == pytest.approx(1 - 3 / 7)
    assert repetition([7] * 9, 4) == pytest.approx(1 - 1 / 6)
    assert repetition([1, 2, 3], 4) is None  # no n-gram can repeat


def test_skewness_by_hand() -> None:
    x = torch.tensor([0.0, 0.0, 0.0, 3.0])  # mean .75; m2 = 6.75 / 4; m3 = 10.125 / 4
    assert skewness(x) == pytest.approx(2.53125 / 1.6875**1.5)
    assert skewness(torch.ones(5)) == 0.0


def test_mismatch_stats_by_hand() -> None:
    sampler = torch.tensor([-1.0, -2.0, -3.0])
    learner = torch.tensor([-1.0, -2.5, -2.0])
    stats = mismatch_stats(sampler, learner)
    assert stats["mean_abs"] == pytest.approx(0.5)
    assert stats["max_abs"] == pytest.approx(1.0)
    # k3 = mean(r - 1 - log r), log r = learner - sampler = 0, -0.5, 1
    k3 = ((math.exp(-0.5) - 1 + 0.5) + (math.e - 1 - 1)) / 3
    assert stats["kl_k3"] == pytest.approx(k3)
    assert stats["pearson"] == pytest.approx(
        float(torch.corrcoef(torch.stack([sampler, learner]))[0, 1])
    )
    same = mismatch_stats(sampler, sampler)
    assert (
        same["mean_abs"] == 0.0 and same["kl_k3"] == 0.0 and same["pearson"] == pytest.approx(1.0)
    )
    assert mismatch_stats(torch.tensor([]), torch.tensor([])) == {}


def _group(task: str, responses: list[list[int]], rewards: list[float]) -> TrajectoryGroup:
    trajs = [
        Trajectory(
            segments=[
                Segment("prompt", [5, 6, 7]),
                Segment("model", ids, logprobs=[-1.0] * len(ids), versions=[0] * len(ids)),
            ],
            reward=r,
            task_id=task,
            traj_id=f"{task}-{i}",
        )
        for i, (ids, r) in enumerate(zip(responses, rewards, strict=True))
    ]
    return TrajectoryGroup(task_id=task, trajectories=trajs, group_id=task)


def test_a_batch_of_repeated_text_and_flat_groups() -> None:
    varied = [[10, 11, 12, 13, 14, 15, 16, 17], [20, 21, 22, 23, 24, 25, 26, 27]]
    looped = [[9, 8] * 6, [9, 8] * 6]
    batch = Batch.from_groups([_group("a", varied, [0.0, 1.0]), _group("b", looped, [1.0, 1.0])])
    mask = batch.loss_mask
    adv = torch.tensor([-1.0, 1.0, 0.0, 0.0])[:, None] * mask
    learner_lp = batch.behavior_logprobs + 0.1 * mask  # the learner a little more confident
    m = batch_monitors(batch, adv, mask, learner_lp, trained_version=0, ngram=4)
    assert m["monitor/reward_std"] == pytest.approx(
        float(torch.tensor([0.0, 1, 1, 1]).std(unbiased=False))
    )
    assert m["monitor/zero_variance_groups"] == 0.5  # group b: both 1.0
    # varied rows repeat nothing; looped rows: 2 distinct 4-grams of 9
    assert m["monitor/repetition"] == pytest.approx((1 - 2 / 9) / 2)
    assert m["monitor/repetition_max"] == pytest.approx(1 - 2 / 9)
    assert m["monitor/response_length"] == pytest.approx(10.0)
    assert m["monitor/mismatch_mean_abs"] == pytest.approx(0.1, abs=1e-6)
    assert m["monitor/mismatch_tokens"] == float(mask.sum())
    # tokens of another version are not a sampler-learner mismatch
    stale = batch_monitors(batch, adv, mask, learner_lp, trained_version=3)
    assert "monitor/mismatch_mean_abs" not in stale


def test_length_drift_and_an_alert_that_fires_into_the_events() -> None:
    events = EventBus()
    seen: list = []
    events.subscribe(seen.append)
    settings = MonitorSettings(
        baseline_steps=2,
        alerts=(("monitor/repetition", "above", 0.5), ("monitor/reward_std", "below", 0.01)),
    )
    monitor = RunMonitor(settings, events)
    assert monitor.observe(1, {"monitor/response_length": 10.0, "monitor/repetition": 0.1}) == []
    m2 = {"monitor/response_length": 14.0, "monitor/reward_std": 0.2}
    monitor.observe(2, m2)
    assert m2["monitor/length_drift"] == pytest.approx(14 / 12 - 1)
    m3 = {"monitor/response_length": 24.0, "monitor/repetition": 0.8, "monitor/reward_std": 0.0}
    fired = monitor.observe(3, m3)
    assert m3["monitor/length_drift"] == pytest.approx(1.0)  # the baseline is steps 1-2 only
    assert [(a.metric, a.side, a.step) for a in fired] == [
        ("monitor/repetition", "above", 3),
        ("monitor/reward_std", "below", 3),
    ]
    assert [e for e in seen if isinstance(e, AlertFired)] == fired
    assert fired[0].to_dict()["event"] == "AlertFired"
    # a resumed run measures drift against the same first steps
    again = RunMonitor(settings)
    again.load_state_dict(monitor.state_dict())
    m4 = {"monitor/response_length": 12.0}
    again.observe(4, m4)
    assert m4["monitor/length_drift"] == pytest.approx(0.0)
