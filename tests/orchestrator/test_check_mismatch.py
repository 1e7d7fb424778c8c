"""`agentrl check mismatch`: the hf sampler against the learner on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from agentrl.cli import app

CONFIG = {
    "model": {"name": "tiny-llama", "dtype": "float32"},
    "env": {"name": "tests.orchestrator.parity_env:ParityEnv"},
    "sampler": {"max_new_tokens": 6, "max_batch_size": 8},
    "rollout": {"group_size": 2, "max_turns": 1, "max_tokens": 64},
    "learner": {"bf16": "off", "fused_logprobs": "off"},  # no kernel compile in a test
    "logging": {"progress": False},
}


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


def test_hf_sampler_and_learner_agree_on_the_tiny_model(tmp_path) -> None:
    out = tmp_path / "mismatch.json"
    args = ["check", "mismatch", str(_config(tmp_path)), "-n", "3", "--json", str(out)]
    result = CliRunner().invoke(app, [*args, "--max-kl", "1e-4", "--max-abs", "1e-3"])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["backend"] == "hf" and report["episodes"] == 6
    assert report["tokens"] == 6 * 6  # every sampled token compared
    # float32 on both sides: the same numbers up to kernel rounding
    assert report["mean_abs"] < 1e-3 and report["kl_k3"] < 1e-5 and report["pearson"] > 0.9999
    assert "kl_k3" in result.output and "worst: token" in result.output


def test_a_gap_above_the_bound_fails(tmp_path) -> None:
    result = CliRunner().invoke(
        app, ["check", "mismatch", str(_config(tmp_path)), "-n", "1", "--max-kl", "-1"]
    )
    assert result.exit_code == 1
    assert "mismatch above the bound: kl_k3" in result.output
