"""`agentrl export`: a checkpoint becomes a folder AutoModelForCausalLM loads, same logits."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
import torch

from agentrl.config import load_config
from agentrl.errors import CheckpointError
from agentrl.run.export import export_checkpoint
from agentrl.run.orchestrator import Orchestrator
from agentrl.runfolder import latest_checkpoint

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "model.name=tiny-llama",
    "model.dtype=float32",
    "env.name=tests.orchestrator.parity_env:ParityEnv",
    "sampler.max_new_tokens=4",
    "sampler.temperature=0.7",
    "rollout.group_size=4",
    "rollout.max_turns=1",
    "rollout.max_tokens=64",
    "learner.batch_groups=2",
    "learner.micro_batch_size=8",
    "learner.lr=1e-2",
    "learner.fused_logprobs=off",
    "orchestrator.learner_worker=thread",
    "orchestrator.max_staleness=0",
    "orchestrator.max_steps=2",
    "orchestrator.checkpoint_every=1",
    "logging.progress=false",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("export") / "run"
    orch = Orchestrator(load_config(overrides=TINY), run)
    orch.build()
    anyio.run(orch.run)
    return run


def _policy(checkpoint: Path):
    from safetensors.torch import load_model

    from agentrl.models import load_model as load_base

    model, _ = load_base("tiny-llama", dtype="float32")
    load_model(model, str(checkpoint / "learner" / "model.safetensors"))
    return model


def test_export_loads_with_transformers_and_matches_the_checkpoint(run_dir: Path, tmp_path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from typer.testing import CliRunner

    from agentrl.cli import app

    out = tmp_path / "hf"
    result = CliRunner().invoke(app, ["export", str(run_dir), str(out)])
    assert result.exit_code == 0, result.output
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Say something (3)."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    reference = _policy(latest_checkpoint(run_dir)).eval()
    fresh = _policy_fresh()
    with torch.no_grad():
        got, want = model(ids).logits, reference(ids).logits
        assert torch.allclose(got, want, atol=1e-5)
        assert not torch.allclose(got, fresh(ids).logits, atol=1e-3)  # trained weights
    gen = GenerationConfig.from_pretrained(out)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert im_end in (
        gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
    )
    assert gen.do_sample and gen.temperature == 0.7
    assert "<|im_start|>assistant" in tok.chat_template
    record = json.loads((out / "agentrl_export.json").read_text())
    assert record["checkpoint"] == "step_000002" and record["version"] == 2
    # generate() stops at the end of the assistant turn
    sample = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert sample.shape[1] > ids.shape[1]


def _policy_fresh():
    from agentrl.models import load_model as load_base

    return load_base("tiny-llama", dtype="float32")[0].eval()


def test_export_a_given_step_and_bad_input(run_dir: Path, tmp_path: Path):
    out = export_checkpoint(run_dir, tmp_path / "s1", step=1)
    assert json.loads((out / "agentrl_export.json").read_text())["checkpoint"] == "step_000001"
    with pytest.raises(
        CheckpointError, match=r"no checkpoint of step 7; kept: step_000001, step_000002"
    ):
        export_checkpoint(run_dir, tmp_path / "s7", step=7)
    with pytest.raises(CheckpointError, match="exists and is not empty"):
        export_checkpoint(run_dir, out, step=1)
    with pytest.raises(CheckpointError, match="not a run directory"):
        export_checkpoint(tmp_path, tmp_path / "x")
