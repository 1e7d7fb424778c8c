"""algorithm.entropy_coef_schedule: the entropy bonus's coefficient from its start to its
end value over the run, by hand, and in the loss the learner minimises."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from agentrl.errors import ConfigError
from agentrl.learner import Learner
from agentrl.learner.objective import check_algorithm
from agentrl.learner.schedule import coef_at
from agentrl.run.settings import objective_settings, resolve
from agentrl.types import TrajectoryGroup
from tests.learner.conftest import make_cfg


def test_linear_and_cosine_from_start_to_end() -> None:
    # 5 steps from 0.01 to 0: linear in quarters; cosine 0.5 (1 + cos(pi p)) of the span
    linear = [coef_at("linear", 0.01, 0.0, s, 5) for s in range(5)]
    assert linear == pytest.approx([0.01, 0.0075, 0.005, 0.0025, 0.0])
    cosine = [coef_at("cosine", 0.01, 0.0, s, 5) for s in range(5)]
    c = 0.5 * (1 + math.cos(math.pi / 4))  # 0.853553
    assert cosine == pytest.approx([0.01, 0.01 * c, 0.005, 0.01 * (1 - c), 0.0])
    # a rising schedule, and steps past the end stay at the end value
    assert coef_at("linear", 0.0, 0.02, 1, 3) == pytest.approx(0.01)
    assert coef_at("linear", 0.0, 0.02, 9, 3) == pytest.approx(0.02)
    assert coef_at("constant", 0.003, 0.0, 7, 10) == 0.003


def test_the_learner_uses_the_steps_coefficient(
    fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> None:
    cfg = make_cfg(
        algorithm={
            "advantage": "grpo",
            "entropy_coef": 0.05,
            "entropy_coef_schedule": "linear",
            "entropy_coef_end": 0.0,
        },
        orchestrator={"max_steps": 3},
    )
    learner = Learner(fresh_model(), None, resolve(cfg).learner)
    seen = []
    for _ in range(3):
        m = learner.step(groups)
        seen.append(m["entropy_coef"])
        # one update on one minibatch: the total is the policy term minus coef * entropy
        want = m["loss/pg"] - m["entropy_coef"] * m["loss/entropy"]
        assert m["loss/total"] == pytest.approx(want, rel=1e-4, abs=1e-6)
    assert seen == pytest.approx([0.05, 0.025, 0.0])


def test_an_end_value_without_a_schedule_is_refused() -> None:
    cfg = make_cfg(algorithm={"entropy_coef": 0.01, "entropy_coef_end": 0.0})
    with pytest.raises(ConfigError, match=r"entropy_coef_schedule is constant"):
        check_algorithm(objective_settings(cfg))
