"""The default job's real path on the real model: ``agentrl train configs/demo.yaml`` with
SmolLM2-135M, the hf sampler, the bwrap sandbox and the learner process, cut to two steps.

Marked integration (``make test-integration``, run by CI): minutes on 2 CPU cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.run.plotting import read_steps
from agentrl.runfolder import latest_checkpoint
from tests.orchestrator.test_train import _trained_staleness

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.integration
@pytest.mark.timeout(1200)
def test_demo_config_trains_smollm2_through_the_cli(tmp_path):
    from safetensors.torch import load_file

    from agentrl.models import load_model

    run_dir = tmp_path / "run"
    sets = [
        "orchestrator.max_steps=2",
        "orchestrator.time_limit_s=null",
        "orchestrator.checkpoint_every=0",
        "rollout.group_size=4",
        "rollout.concurrency=8",
        "learner.batch_groups=1",
        "learner.micro_batch_size=4",
        "sampler.max_new_tokens=48",
        "logging.progress=false",
    ]
    args = [sys.executable, "-m", "agentrl.cli", "train", "configs/demo.yaml"]
    args += ["--run-dir", str(run_dir), "--no-summary"]
    for s in sets:
        args += ["--set", s]
    done = subprocess.run(
        args,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        timeout=1100,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]

    steps = read_steps(run_dir)
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:  # dynamic sampling (demo.yaml's): every trained group has signal
        assert s["loss/total"] == s["loss/total"] and s["grad_norm"] > 0
    # demo.yaml is asynchronous (max_staleness 1): the bound holds on the trained tokens
    recomputed = _trained_staleness(run_dir)
    assert [st for st, _ in recomputed] == [s["staleness/max"] for s in steps]
    assert all(st <= 1 for st, _ in recomputed)

    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None  # the last step always checkpoints
    trained = load_file(str(ckpt / "learner" / "model.safetensors"))
    fresh, _ = load_model("smollm2-135m-instruct", dtype="float32")
    changed = [k for k, v in fresh.state_dict().items() if k in trained and not v.equal(trained[k])]
    assert changed, "two steps left SmolLM2's weights unchanged"
