"""`agentrl train` through the vllm backend, then `agentrl eval` on the result (run in
.venv-vllm: `make test-vllm`). The shipped configs/vllm_code_math.yaml on a tiny model and the
parity task, synchronous (every step trains the version it just published, so the learner's
log-prob gap proves each version vLLM sampled with) with the learner in its own process."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
pytest.importorskip("vllm", reason="needs .venv-vllm (make test-vllm)")

from agentrl.run.plotting import read_steps  # noqa: E402
from tests.samplers.vllm_train import agentrl, audit_tokens, read_jsonl, save_tiny_model, sets  # noqa: E402

CONFIG = "configs/vllm_code_math.yaml"


def overrides(model_dir) -> list[str]:
    return [
        f"model.name={model_dir}",
        "model.dtype=float32",
        "env.name=tests.orchestrator.parity_env:ParityEnv",
        "sampler.max_new_tokens=4",
        "sampler.max_batch_size=16",
        "sampler.options={enforce_eager: true, max_model_len: 256}",
        "rollout.group_size=4",
        "rollout.concurrency=16",
        "rollout.max_turns=1",
        "rollout.max_tokens=64",
        "learner.batch_groups=2",
        "learner.micro_batch_size=8",
        "learner.lr=1e-3",
        "learner.bf16=off",  # fp32 on both sides: the log-prob gap measures exactness
        "learner.fused_logprobs=off",
        "logging.progress=false",
    ]


def test_train_three_steps_then_eval(tmp_path):
    model_dir = save_tiny_model(tmp_path / "tiny")
    run_dir = tmp_path / "run"
    cfg = overrides(model_dir)
    train = [
        "orchestrator.max_steps=3",
        "orchestrator.max_staleness=0",
        "orchestrator.learner_worker=process",
        "orchestrator.checkpoint_every=1",  # keeps the last two: versions 2 and 3
    ]
    agentrl("train", CONFIG, "--run-dir", str(run_dir), "--no-summary", *sets(*cfg, *train))

    steps = read_steps(run_dir)
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["staleness/max"] == 0 for s in steps)
    # the learner re-scored what vLLM sampled: the gap is logged every step and is float
    # noise, so vLLM sampled step k's tokens with exactly the learner's version k-1
    assert all("logprob_gap/mean" in s and "logprob_gap/max" in s for s in steps)
    gaps = [s["logprob_gap/staleness_0"] for s in steps]
    assert max(gaps) < 1e-3, gaps
    # weight versions advance in the sampler: published 1, 2, 3; vLLM tagged the tokens of
    # step k with version k-1, and they are the ones those weights give (recomputed here
    # for the versions whose weights the run keeps: the base model and checkpoint 2)
    events = read_jsonl(run_dir / "metrics.jsonl")
    assert [e["version"] for e in events if e["event"] == "WeightsPublished"] == [1, 2, 3]
    checked = audit_tokens(run_dir, model_dir, temperature=1.0)
    assert set(checked) == {0, 1, 2} and checked[0] and checked[2], checked
    print(f"\ntokens recomputed by version: {checked}; learner gaps by step {gaps}")

    out = tmp_path / "eval.json"
    agentrl("eval", CONFIG, "--checkpoint", str(run_dir), "-n", "3", "-k", "2",
            "--out", str(out), *sets(*cfg))  # fmt: skip
    result = json.loads(out.read_text())
    assert result["version"] == 3 and result["tasks"] == 3 and result["infra_errors"] == 0
    assert 0.0 <= result["metrics"]["pass@1"] <= result["metrics"]["pass@2"] <= 1.0
