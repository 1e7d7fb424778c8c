"""fp16 autocast with loss scaling: trains, skips overflowing updates, checkpoints the scale."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from agentrl.errors import ConfigError
from agentrl.learner import Learner
from agentrl.types import TrajectoryGroup
from tests.learner.conftest import make_cfg


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
def test_fp16_step_trains_with_a_loss_scale(
    packing: bool, fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> None:
    cfg = make_cfg(learner={"fp16": "on", "bf16": "auto", "packing": packing})
    learner = Learner(fresh_model(), None, cfg)
    assert learner.precision.fp16 and not learner.bf16
    assert learner.precision.compute_dtype == torch.float16
    assert learner.scaler.is_enabled()
    before = _flat(learner.model)
    metrics = learner.step(groups)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["learner/skipped_steps"] == 0 and metrics["nonfinite_skipped"] == 0
    assert metrics["learner/loss_scale"] == 2.0**16  # torch's initial scale, not yet grown
    assert next(learner.model.parameters()).dtype == torch.float32  # fp32 master weights
    assert not torch.equal(before, _flat(learner.model))
    assert metrics["logprob_gap/mean"] < 0.1  # fp16 rounding only
    # the gradients the optimizer saw were unscaled: clipping saw the true norm
    plain = Learner(fresh_model(), None, make_cfg())
    assert metrics["grad_norm"] == pytest.approx(plain.step(groups)["grad_norm"], rel=0.05)


def test_an_overflowing_gradient_skips_the_update_and_lowers_the_scale(
    fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> None:
    cfg = make_cfg(learner={"fp16": "on", "minibatches": 2})
    learner = Learner(fresh_model(), None, cfg)
    weight = learner.model.get_input_embeddings().weight
    hook = weight.register_hook(lambda g: g * math.inf)  # every backward overflows
    before = _flat(learner.model)
    state_before = {k: dict(v) for k, v in learner.optimizer.state.items()}
    metrics = learner.step(groups)
    assert metrics["learner/skipped_steps"] == 2  # both minibatch updates
    assert metrics["learner/loss_scale"] == 2.0**14  # halved twice
    assert torch.equal(before, _flat(learner.model))  # no weight moved
    assert learner.optimizer.state == {} == state_before  # AdamW never stepped
    hook.remove()
    metrics = learner.step(groups)
    assert metrics["learner/skipped_steps"] == 0 and metrics["learner/loss_scale"] == 2.0**14
    assert not torch.equal(before, _flat(learner.model))
    assert learner.skipped_steps == 2


def test_checkpoint_keeps_the_loss_scale(
    tmp_path: Path, fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> None:
    cfg = make_cfg(learner={"fp16": "on"})
    a = Learner(fresh_model(), None, cfg)
    a.step(groups)
    a.scaler.update(1024.0)  # a scale no fresh scaler has
    a.step(groups)  # and a growth tracker of 2
    a.save_checkpoint(tmp_path / "ckpt")
    b = Learner(fresh_model(), None, cfg)
    assert b.scaler.get_scale() == 2.0**16
    b.load_checkpoint(tmp_path / "ckpt")
    assert b.scaler.get_scale() == a.scaler.get_scale() == 1024.0
    assert b.scaler.state_dict() == a.scaler.state_dict()  # growth tracker too
    # a float32 learner loads an fp16 checkpoint (and the other way round)
    Learner(fresh_model(), None, make_cfg()).load_checkpoint(tmp_path / "ckpt")
    plain = Learner(fresh_model(), None, make_cfg())
    plain.save_checkpoint(tmp_path / "plain")
    c = Learner(fresh_model(), None, cfg)
    c.load_checkpoint(tmp_path / "plain")
    assert c.scaler.get_scale() == 2.0**16


def test_fp16_and_bf16_on_together_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"learner\.fp16=on and learner\.bf16=on"):
        make_cfg(learner={"fp16": "on", "bf16": "on"})
    assert make_cfg(learner={"fp16": True}).learner.fp16 == "on"  # YAML's bare on
