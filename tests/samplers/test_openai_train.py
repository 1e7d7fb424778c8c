"""`agentrl train` through the openai backend against a real `vllm serve` on 127.0.0.1, with a
weight reload after every step (run in .venv-vllm: `make test-vllm`). The shipped
configs/vllm_code_math.yaml as it is (asynchronous, one step of staleness) on a tiny model and
the parity task."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
pytest.importorskip("vllm", reason="needs .venv-vllm (make test-vllm)")

from agentrl.run.plotting import read_steps  # noqa: E402
from tests.samplers.test_vllm_train import CONFIG, overrides  # noqa: E402
from tests.samplers.vllm_train import (  # noqa: E402
    agentrl,
    audit_tokens,
    read_jsonl,
    save_tiny_model,
    sets,
    vllm_server,
)


def test_train_three_steps_against_vllm_serve(tmp_path):
    model_dir = save_tiny_model(tmp_path / "tiny")
    run_dir = tmp_path / "run"
    server_args = ["--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", "16"]
    with vllm_server(model_dir, tmp_path / "serve.log", *server_args) as url:
        cfg = [
            *(
                o
                for o in overrides(model_dir)
                if not o.startswith(("model.dtype", "sampler.options"))
            ),
            "model.dtype=auto",  # the server's --dtype decides
            "sampler.backend=openai",
            f"sampler.base_url={url}",
            "sampler.options={reload_endpoint: true}",
            "orchestrator.max_steps=3",
        ]
        agentrl("train", CONFIG, "--run-dir", str(run_dir), "--no-summary", *sets(*cfg))

    steps = read_steps(run_dir)
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["staleness/max"] <= 1 for s in steps)
    assert all("logprob_gap/mean" in s for s in steps)
    # step 1 trains what the server sampled with the base weights: the learner agrees
    assert steps[0]["logprob_gap/staleness_0"] < 1e-3, steps[0]
    # the server reloaded the published weights and tagged later tokens with their version
    events = read_jsonl(run_dir / "metrics.jsonl")
    assert [e["version"] for e in events if e["event"] == "WeightsPublished"] == [1, 2, 3]
    checked = audit_tokens(run_dir, model_dir, temperature=1.0)
    assert checked.get(0) and max(checked) >= 1, checked
    print(f"\ntokens recomputed by version: {checked}")
