"""fp16 autocast with loss scaling: trains, skips overflowing updates, checkpoints the scale."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from agentrl.errors import ConfigError
from agentrl.learner import Learner
from agentrl.run.settings import resolve
from agentrl.types import TrajectoryGroup
from tests.learner.conftest import make_cfg


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
def test_fp16_step_trains_with_a_loss_scale(
    packing: bool, fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> None:
    cfg = make_cfg(learner={"fp16": "on", "bf16": "auto", "packing": packing})
    learner = Learner(fresh_model(), None, resolve(cfg).learner)
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
    plain = Learner(fresh_model(), None, resolve(make_cfg()).learner)
    assert metrics["grad_norm"] == pytest.approx(plain.step(groups)["grad_norm"], rel=0.05)


def test_an_overflowing_gradient_skips_the_update_and_lowers_the_scale(
    fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> None:
    cfg = make_cfg(learner={"fp16": "on", "minibatches": 2})
    learner = Learner(fresh_model(), None, resolve(cfg).learner)
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
    a = Learner(fresh_model(), None, resolve(cfg).learner)
    a.step(groups)
    a.scaler.update(1024.0)  # a scale no fresh scaler has
    a.step(groups)  # and a growth tracker of 2
    a.save_checkpoint(tmp_path / "ckpt")
    b = Learner(fresh_model(), None, resolve(cfg).learner)
    assert b.scaler.get_scale() == 2.0**16
    b.load_checkpoint(tmp_path / "ckpt")
    assert b.scaler.get_scale() == a.scaler.get_scale() == 1024.0
    assert b.scaler.state_dict() == a.scaler.state_dict()  # growth tracker too
    # a float32 learner loads an fp16 checkpoint (and the other way round)
    Learner(fresh_model(), None, resolve(make_cfg()).learner).load_checkpoint(tmp_path / "ckpt")
    plain = Learner(fresh_model(), None, resolve(make_cfg()).learner)
    plain.save_checkpoint(tmp_path / "plain")
    c = Learner(fresh_model(), None, resolve(cfg).learner)
    c.load_checkpoint(tmp_path / "plain")
    assert c.scaler.get_scale() == 2.0**16


def test_fp16_and_bf16_on_together_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"learner\.fp16=on and learner\.bf16=on"):
        make_cfg(learner={"fp16": "on", "bf16": "on"})
    assert make_cfg(learner={"fp16": True}).learner.fp16 == "on"  # YAML's bare on


class _WeightCasts(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the casts of `params` (by storage) to a half dtype."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        super().__init__()
        self.storages = {p.untyped_storage().data_ptr() for p in params}
        self.casts = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (
            func is torch.ops.aten._to_copy.default
            and kwargs.get("dtype") in (torch.float16, torch.bfloat16)
            and args[0].untyped_storage().data_ptr() in self.storages
        ):
            self.casts += 1
        return func(*args, **kwargs)


@pytest.mark.parametrize("half", ["fp16", "bf16"])
def test_an_update_casts_each_weight_once_for_all_its_micro_batches(
    half: str,
    fresh_model: Callable[[], torch.nn.Module],
    groups: list[TrajectoryGroup],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Autocast's casts of the float32 weights are shared by an update's micro-batches
    (Precision.casts_once): as many casts at 1 row a micro-batch as with all rows in one,
    and the same weights, bit for bit, as casting again in every micro-batch."""
    from agentrl.learner import precision

    # bf16 on any CPU: autocast runs it without native instructions, only slower
    monkeypatch.setattr(precision, "bf16_supported", lambda device: True)
    # fused_logprobs off: torch.compile would skip frames it meets under the counting mode,
    # for the rest of the process
    half_cfg = {"fp16": "on"} if half == "fp16" else {"bf16": "on"}
    half_cfg["fused_logprobs"] = "off"
    groups = groups[:2]

    def run(micro_batch_size: int) -> tuple[int, torch.Tensor]:
        learner = Learner(
            fresh_model(),
            None,
            resolve(make_cfg(learner={**half_cfg, "micro_batch_size": micro_batch_size})).learner,
        )
        assert learner.precision.compute_dtype != torch.float32
        with _WeightCasts(list(learner.model.parameters())) as mode:
            learner.step(groups)
        return mode.casts, _flat(learner.model)

    rows = sum(len(g.trajectories) for g in groups)
    one_casts, one_weights = run(1)
    all_casts, _ = run(rows)
    assert one_casts == all_casts > 0
    monkeypatch.setattr(
        precision.Precision, "casts_once", lambda self: contextlib.nullcontext()
    )  # the old way: each micro-batch casts again
    again_casts, again_weights = run(1)
    assert again_casts > one_casts
    assert torch.equal(one_weights, again_weights)
