"""Checkpoint faults on a real tiny-model run: a corrupt latest checkpoint (resume falls
back to the previous one and says so) and a full disk while a checkpoint is written (a
60 MB tmpfs holds one checkpoint, not two: the run stops with one line, the previous
checkpoint stays whole, a resume on a roomier disk finishes the run)."""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

import pytest

from agentrl.errors import CheckpointError, user_error
from agentrl.runfolder import latest_checkpoint, load_run_checkpoint
from tests.procs import live_descendants

from .harness import audit, run_in_process


def _corrupt(ckpt: Path, how: str) -> None:
    if how == "weights":  # torn write below the COMPLETE marker (bit rot, a bad copy)
        weights = ckpt / "learner" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])
    elif how == "loop_state":
        (ckpt / "orchestrator.json").write_text('{"step": 3, "curs')
    else:  # the marker is gone: the folder is not known to be whole
        (ckpt / "COMPLETE").unlink()


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(tmp_path, caplog):
    run_dir = tmp_path / "run"
    run_in_process(run_dir, 3)
    _corrupt(run_dir / "checkpoints" / "step_000003", "weights")
    with caplog.at_level(logging.WARNING, logger="agentrl.runfolder"):
        orch = run_in_process(run_dir, 4, resume=True)
    said = [r.getMessage() for r in caplog.records]
    assert any("step_000003 is unreadable" in m for m in said), said
    assert any("resuming from the previous checkpoint" in m and "step_000002" in m for m in said)
    assert orch.step == orch.learner.version == 4
    a = audit(run_dir)
    # step 3 is trained again from step 2's state: it was never safely kept
    assert a.steps_ok and a.final_step == 4, a
    assert a.trained_twice == 0 and a.steps_lost == [3]
    assert a.checkpoint_loadable, a.checkpoint_error

    # the loop's part torn, or the marker gone: the same fallback (now to the new step 3)
    for how in ("loop_state", "marker"):
        copy = tmp_path / how
        shutil.copytree(run_dir, copy)
        _corrupt(copy / "checkpoints" / "step_000004", how)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="agentrl.runfolder"):
            ckpt, state = load_run_checkpoint(copy)
        assert ckpt.name == "step_000003" and state["step"] == 3
        assert any("step_000004" in r.getMessage() for r in caplog.records)
    # nothing readable left: one error naming the latest and what is wrong with it
    _corrupt(tmp_path / "loop_state" / "checkpoints" / "step_000003", "loop_state")
    with pytest.raises(CheckpointError, match=r"step_000004.*orchestrator\.json is corrupt"):
        load_run_checkpoint(tmp_path / "loop_state")


@pytest.fixture
def small_disk(tmp_path):
    """RUN_DIR/checkpoints on a 60 MB tmpfs (a tiny-model checkpoint is ~38 MB)."""
    where = tmp_path / "run" / "checkpoints"
    where.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=60m", "tmpfs", str(where)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_full_disk_during_a_checkpoint_write(tmp_path, small_disk):
    run_dir = tmp_path / "run"
    before = live_descendants()
    with pytest.raises(BaseException) as raised:
        run_in_process(run_dir, 3)
    error = user_error(raised.value)
    assert isinstance(error, CheckpointError), raised.value
    message = str(error)
    assert "\n" not in message
    assert "could not write checkpoint step_000002" in message and "disk full?" in message
    assert "the previous checkpoint step_000001 is intact" in message
    # the partial folder is gone; step 1 is whole and still the latest
    assert sorted(p.name for p in small_disk.iterdir()) == ["latest", "step_000001"]
    assert latest_checkpoint(run_dir).name == "step_000001"
    assert live_descendants() <= before
    # more room (the user freed space), then --resume finishes the run
    subprocess.run(["mount", "-o", "remount,size=400m", str(small_disk)], check=True)
    orch = run_in_process(run_dir, 3, resume=True)
    assert orch.step == 3
    a = audit(run_dir)
    assert a.steps_ok and a.steps_lost == [] and a.trained_twice == 0, a
    assert a.checkpoint_loadable, a.checkpoint_error
