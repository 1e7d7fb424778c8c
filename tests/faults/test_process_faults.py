"""A process of a running training run dies or is interrupted: the learner child
(SIGKILL mid-step), the driver (Ctrl-C twice), a sandbox kernel under an episode, the
search service until an episode felt it. Each kill lands at a point the run marks (an
event in metrics.jsonl, a process in its code), never at a random offset. Each run is
audited afterwards (tests/faults/harness.py): steps completed, trained samples once
each, no orphan process, the checkpoint loads."""

from __future__ import annotations

import shutil

import pytest

from . import scenarios


def _clean(r: dict) -> None:
    assert r["survived"], r
    assert r["steps_lost"] == 0 and r["trained_twice"] == 0 and r["orphans"] == 0, r
    assert r["checkpoint_loadable"], r


@pytest.mark.slow
def test_learner_child_sigkill_mid_step(tmp_path):
    r = scenarios.learner_kill(tmp_path / "run", max_steps=4)
    _clean(r)
    assert r["killed"] and r["driver_exit_ok"], r
    assert r["driver_said"].startswith("error: the learner process died while"), r
    assert "killed by signal 9" in r["driver_said"], r


@pytest.mark.slow
def test_sigint_twice_checkpoints_and_stops(tmp_path):
    # the second once the driver said it is stopping: it interrupts the shutdown itself
    r = scenarios.sigint_twice(tmp_path / "run", max_steps=4, second="after_ack")
    _clean(r)
    assert r["reason"] == "interrupted" and r["checkpointed_last_step"], r
    assert r["driver_exit_code"] == 130 and not r["traceback"], r
    assert r["steps_redone"] == 0, r  # the step in flight was finished and kept


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the python tool's sandbox needs bwrap")
def test_sandbox_killed_under_a_running_episode(tmp_path):
    r = scenarios.sandbox_kernel_kill(tmp_path / "run", max_steps=3, kills=2)
    _clean(r)
    assert r["kernels_killed"] == 2, r
    # a dead kernel is the code's outcome (it may have killed itself): the agent sees it;
    # a dead bwrap is the platform's: the episode is retried (or masked as infra_error)
    assert r["killed_seen_by_agent"] >= 1, r
    assert r["sandbox_failed_seen"] >= 1, r
    assert r["episodes_retried"] + r["episodes_infra_error"] >= 1, r


@pytest.mark.slow
def test_search_service_down_until_an_episode_felt_it(tmp_path):
    r = scenarios.search_down(tmp_path / "run", max_steps=3, felt=1)
    _clean(r)
    assert r["outage_felt"], r  # the service came back only after an episode failed
    assert r["episodes_retried"] + r["episodes_infra_error"] >= 1, r
