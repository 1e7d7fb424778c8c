"""The async_vs_sync benchmark's run function still runs end to end (2 short steps)."""

from __future__ import annotations

import argparse
import math

import pytest

from benchmarks.async_vs_sync import run_mode


@pytest.mark.parametrize("staleness", [0, 1])
@pytest.mark.slow  # a benchmark run per mode
def test_run_mode_reports_every_field(tmp_path, staleness):
    args = argparse.Namespace(
        model="tiny-llama",
        dtype="float32",
        delay=0.01,
        turns=2,
        max_new_tokens=4,
        group_size=2,
        batch_groups=2,
        epochs=1,
        steps=2,
        threads=0,
    )
    row = run_mode(args, staleness, tmp_path / "run")
    assert row["steps"] == 2 and row["trajectories"] == 2 * 2 * 2
    assert row["trajectories_per_s"] > 0 and row["wall_s"] > 0
    for key in ("learner_idle_frac", "sampler_idle_frac"):
        assert 0.0 <= row[key] <= 1.0, key
    assert row["cpu_util"] > 0
    assert math.isfinite(row["reward_first"])  # step 1 always has finished rollouts
