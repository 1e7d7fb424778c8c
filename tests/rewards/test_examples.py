"""The bring-your-own examples run as written (on the tiny model, one step)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from agentrl.rollout.sinks import read_groups

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_trl_style_script(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    out = _example("trl_style").main(["--tiny", "--steps", "1", "--out", str(tmp_path)])
    assert len(out["steps"]) == 1
    assert AutoModelForCausalLM.from_pretrained(out["model_dir"]) is not None
    traj = read_groups(out["run_dir"])[0].trajectories[0]
    assert set(traj.reward_info["rewards"]) == {"env", "correct", "concise"}


@pytest.mark.slow  # trains a reward model, then an RL run on it
def test_reward_model_pipeline(tmp_path: Path) -> None:
    out = _example("reward_model").main(
        ["--tiny", "--steps", "1", "--pairs", "40", "--out", str(tmp_path)]
    )
    assert out["report"].eval_pairs == 4 and 0.0 <= out["report"].accuracy <= 1.0
    assert len(out["steps"]) == 1 and "kl_reward_mean" in out["steps"][0]
    traj = read_groups(out["run_dir"])[0].trajectories[0]
    assert "reward_model" in traj.reward_info["rewards"]
