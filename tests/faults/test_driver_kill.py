"""SIGKILL of the driver (`agentrl train`) at chosen moments, each followed by `--resume`:
every checkpointed step is kept, the groups buffered in the checkpoint are trained after
the resume, nothing is trained twice, no process of the driver's group outlives it.
(Ten random moments: ``benchmarks/faults.py``.)"""

from __future__ import annotations

import pytest

from .scenarios import driver_kills


@pytest.mark.slow
def test_driver_sigkill_while_checkpointing_and_while_groups_are_buffered(tmp_path):
    run_dir = tmp_path / "run"
    r = driver_kills(run_dir, ["during_checkpoint_write", "while_buffered"], max_steps=6)
    assert r["survived"], r
    assert r["moments_hit"] == 2, r
    assert r["steps_lost"] == 0 and r["trained_twice"] == 0 and r["orphans"] == 0, r
    assert r["buffered_restored"] >= 1, r  # the path under test ran
    assert r["buffered_trained_after_resume"] == r["buffered_restored"], r
    assert r["reissued_trained_after_resume"] == r["reissued"], r
    assert r["checkpoint_loadable"], r
