"""algorithm.ref_refresh_every: the reference becomes the policy every N steps, and a
resumed run goes on with the refreshed reference, not the initial model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from agentrl.errors import ConfigError
from agentrl.learner import Learner
from agentrl.learner.objective import check_algorithm
from agentrl.run.settings import objective_settings, resolve
from agentrl.types import TrajectoryGroup
from tests.learner.conftest import make_cfg

KL = {"advantage": "grpo", "kl": "k3", "kl_coef": 0.1, "ref_refresh_every": 2}


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def _learner(fresh_model: Callable[[], torch.nn.Module]) -> Learner:
    return Learner(fresh_model(), None, resolve(make_cfg(algorithm=KL)).learner)


def test_the_reference_is_the_policy_after_every_nth_step(
    fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup], tmp_path: Path
) -> None:
    learner = _learner(fresh_model)
    initial = fresh_model()
    m1 = learner.step(groups)
    assert "ref/refreshed" not in m1
    assert _same(learner.ref_model, initial) and not _same(learner.model, initial)
    m2 = learner.step(groups)
    assert m2["ref/refreshed"] == 1.0
    assert _same(learner.ref_model, learner.model)
    # the step after a refresh starts at KL 0 to the reference (one update: the loss sees
    # the policy before its own update); before it the policy had drifted from the initial one
    m3 = learner.step(groups)
    assert m1["kl"] == pytest.approx(0.0, abs=1e-7) and m2["kl"] > 1e-6
    assert m3["kl"] == pytest.approx(0.0, abs=1e-7)
    assert not _same(learner.ref_model, learner.model)  # step 3 moved only the policy

    # a checkpoint after step 3 holds the reference of step 2; a resumed learner has it
    learner.save_checkpoint(tmp_path / "ckpt")
    resumed = _learner(fresh_model)
    assert _same(resumed.ref_model, initial)
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert _same(resumed.ref_model, learner.ref_model)
    assert _same(resumed.model, learner.model)
    assert resumed.step(groups)["ref/refreshed"] == 1.0  # step 4
    assert _same(resumed.ref_model, resumed.model)


def test_ref_refresh_needs_a_reference() -> None:
    cfg = make_cfg(algorithm={"advantage": "grpo", "ref_refresh_every": 5})
    with pytest.raises(ConfigError, match=r"ref_refresh_every=5 .* has none"):
        check_algorithm(objective_settings(cfg))
    assert check_algorithm(objective_settings(make_cfg(algorithm=KL))).needs_ref


def test_a_lora_reference_is_refused(fresh_model: Callable[[], torch.nn.Module]) -> None:
    from agentrl.learner.lora import AdaptersOff
    from agentrl.learner.reference import check_refreshable

    with pytest.raises(ConfigError, match="LoRA run's reference is the policy"):
        check_refreshable(2, AdaptersOff(fresh_model()))
    check_refreshable(0, AdaptersOff(fresh_model()))  # off: nothing to refresh
