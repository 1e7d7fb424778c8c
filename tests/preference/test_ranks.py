"""DPO on the trainer core's levers: ``agentrl dpo`` on 2 FSDP ranks (gloo) trains the
1-process weights, and compiled decoder layers (``learner.compile``) train like eager ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentrl.config import load_config
from agentrl.preference.run import train_preference
from agentrl.run.settings import preference_settings
from tests.learner.ranks import free_port, run_ranks
from tests.preference.ranks_worker import SETTINGS, config
from tests.preference.test_data import write
from tests.preference.test_train import text_pairs


def train_losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["kind"] == "train"]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "model" / "model.safetensors"))


def assert_same_training(got: Path, want: Path) -> None:
    """Per-step losses to 1e-4 relative and the trained weights to 1e-4: float sums in
    another order (another rank split, another kernel), on any CPU kind."""
    losses, reference = train_losses(got), train_losses(want)
    assert len(losses) == len(reference) == 3
    assert losses == pytest.approx(reference, rel=1e-4)
    assert reference[-1] < reference[0]  # it trained
    a, b = weights(got), weights(want)
    assert a.keys() == b.keys()
    for name in b:
        torch.testing.assert_close(a[name], b[name], atol=1e-4, rtol=0)
    base = weights_before(want)
    moved = max(float((b[n] - base[n]).abs().max()) for n in b.keys() & base.keys())
    assert moved > 1e-3  # the comparison is of weights that changed


def weights_before(run: Path) -> dict[str, torch.Tensor]:
    from agentrl.models import load_model

    model, _ = load_model("tiny-llama", dtype="float32", seed=0)
    return {k: v.detach() for k, v in model.state_dict().items()}


@pytest.mark.slow  # two torch.distributed processes, each loading and training
def test_dpo_on_two_fsdp_ranks_trains_the_one_process_weights(tmp_path: Path) -> None:
    data = write(tmp_path / "pairs.jsonl", text_pairs(12))
    one = tmp_path / "one"
    train_preference(data, one, settings=preference_settings(config(1, "ddp")), log=lambda _: None)
    two = tmp_path / "two"
    run_ranks(
        "tests.preference.ranks_worker",
        2,
        "2",
        str(free_port()),
        str(data),
        str(two),
    )
    assert_same_training(two, one)
    # the sharded checkpoint is the layout a single trainer and `agentrl export` read
    part = two / "checkpoints" / "step_000003" / "learner"
    assert {"model.safetensors", "trainer_state.pt", "learner.json", "sharded"} <= {
        p.name for p in part.iterdir()
    }


@pytest.mark.slow  # inductor compiles the layers once per process
def test_dpo_with_compiled_layers_trains_like_eager(tmp_path: Path) -> None:
    data = write(tmp_path / "pairs.jsonl", text_pairs(12))
    eager = tmp_path / "eager"
    train_preference(
        data, eager, settings=preference_settings(config(1, "ddp")), log=lambda _: None
    )
    on = tmp_path / "compiled"
    cfg = load_config(overrides=[*SETTINGS, "learner.compile=on"])
    # aot_eager: inductor's codegen takes minutes of a 2-core CPU
    train_preference(
        data, on, settings=preference_settings(cfg), log=lambda _: None, compile_backend="aot_eager"
    )
    assert_same_training(on, eager)
