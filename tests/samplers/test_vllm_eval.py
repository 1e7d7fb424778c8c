"""`agentrl eval` through the vllm backend: a training checkpoint reaches the engine through
its weight-update path (run in .venv-vllm: `make test-vllm`)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
pytest.importorskip("vllm", reason="needs .venv-vllm (make test-vllm)")

import anyio  # noqa: E402
import torch  # noqa: E402

from agentrl.config import load_config  # noqa: E402
from agentrl.run.components import load_learner  # noqa: E402
from agentrl.run.evaluation import evaluate  # noqa: E402
from agentrl.run.settings import resolve  # noqa: E402
from agentrl.runfolder import save_run_checkpoint  # noqa: E402

OVERRIDES = [
    "model.name=smollm2-135m-instruct",
    "model.dtype=float32",
    "sampler.backend=vllm",
    "sampler.max_new_tokens=4",
    "sampler.max_batch_size=8",
    "sampler.options={max_model_len: 512}",
    "env.name=tests.orchestrator.parity_env:ParityEnv",
    "rollout.max_turns=1",
    "rollout.max_tokens=64",
    "learner.fused_logprobs=off",
]


def test_eval_with_the_vllm_backend_loads_a_checkpoint(tmp_path):
    cfg = load_config(overrides=OVERRIDES)
    learner = load_learner(resolve(cfg).learner)
    with torch.no_grad():  # a visibly different policy than the base model's
        learner.model.get_output_embeddings().weight.mul_(0.5)
    learner.version = 3
    run_dir = tmp_path / "run"
    save_run_checkpoint(run_dir, 3, {"step": 3}, learner.save_checkpoint)

    result = anyio.run(evaluate, cfg, run_dir, 3, 2)
    assert result["version"] == 3 and result["tasks"] == 3
    assert result["infra_errors"] == 0
    m = result["metrics"]
    assert 0.0 <= m["pass@1"] <= m["pass@2"] <= 1.0 and "maj@2" in m
