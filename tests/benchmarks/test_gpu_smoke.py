"""benchmarks/gpu.py runs end to end on the CPU with --smoke (tiny shapes): every section's
figures are there and finite. The async section reuses async_vs_sync.run_mode, which
test_async_vs_sync.py runs already, so it is left out here to keep this test short."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.gpu import main


@pytest.mark.slow  # every section of the GPU benchmark, on the CPU
def test_the_gpu_benchmark_runs_on_the_cpu_with_smoke(tmp_path):
    out = tmp_path / "gpu_smoke.json"
    result = main(["--smoke", "--only", "sampler", "learner", "publish", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    env = result["environment"]
    assert env["device"] == "cpu" and env["gpu"] is None and len(env["load_average"]) == 3
    sampler = result["sampler"]
    # on a CPU: the default sampler and the fixed-slot one (eager; graphs need CUDA)
    assert set(sampler["by_variant"]) == {"growing", "static"} and sampler["errors"] == {}
    assert sampler["by_concurrency"] == sampler["by_variant"]["growing"]
    assert sampler["stats"]["static"]["cuda_graphs"] == 0
    for rows in sampler["by_variant"].values():
        assert rows
        for row in rows.values():
            assert row["generate_tok_s"] > 0 and row["sampler_tok_s"] > 0
            assert math.isclose(row["ratio"], row["sampler_tok_s"] / row["generate_tok_s"])
    rows = result["learner"]["rows"]
    assert rows and all(r["tokens_per_s"] > 0 and r["mfu"] is None for r in rows)  # no GPU peak
    assert {r["packing"] for r in rows} == (
        {False, True} if result["learner"]["packing_available"] else {False}
    )
    publish = result["publish"]["in_process"]
    assert set(publish) == {"shared_memory"}  # CUDA IPC needs a GPU
    assert publish["shared_memory"]["total_s_median"] > 0
