"""`make demo-code`: its config is valid and its held-out tasks are held out; the script
(eval, train, eval) runs end to end on the tiny random model (slow tier)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.envs import make_env

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "demo_code.yaml"


def test_demo_config_loads_and_its_eval_tasks_are_held_out() -> None:
    cfg = load_config(CONFIG)
    assert cfg.env.name == "code_tests"
    env = make_env(cfg.env.name, **cfg.env.options)
    train = {t["id"] for t in env.tasks("train", seed=cfg.orchestrator.seed)}
    held_out = [t["id"] for t in env.tasks("eval", seed=cfg.orchestrator.seed)][:32]
    assert len(held_out) == 32 and train.isdisjoint(held_out)


@pytest.mark.slow  # three CLI processes: eval, train two steps, eval
def test_demo_script_runs_eval_train_eval(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    sets = [
        "model.name=tiny-llama",
        "model.dtype=float32",
        "orchestrator.max_steps=2",
        "orchestrator.checkpoint_every=1",
        "algorithm.dynamic_sampling=false",  # random weights solve nothing: keep every group
        "rollout.group_size=2",
        "rollout.max_turns=2",
        "sampler.max_new_tokens=8",
        "logging.progress=false",
    ]
    args = [sys.executable, "scripts/demo_code.py", "--run-dir", str(run_dir), "-n", "2", "-k", "2"]
    for s in sets:
        args += ["--set", s]
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads((run_dir / "demo_code.json").read_text())
    assert result["held_out_tasks"] == 2 and result["samples_per_task"] == 2
    assert result["before"]["checkpoint"] is None and result["after"]["version"] == 2
    assert 0.0 <= result["pass@1_before"] <= 1.0 and 0.0 <= result["pass@1_after"] <= 1.0
    assert result["before"]["infra_errors"] == 0 and result["after"]["infra_errors"] == 0
    assert "held-out pass@1:" in done.stdout
