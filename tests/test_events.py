"""The progress line of a trained step, with and without rollout numbers."""

from __future__ import annotations

import io

from rich.console import Console

from agentrl.events import BatchTrained, ProgressDisplay


def _line(metrics: dict[str, float]) -> str:
    out = io.StringIO()
    display = ProgressDisplay(max_steps=5, console=Console(file=out, width=200))
    display(BatchTrained(step=2, version=2, metrics=metrics))
    return out.getvalue()


def test_progress_line_shows_reward_and_staleness():
    line = _line({"reward_mean": 0.625, "success_rate": 0.5, "staleness/mean": 1.0})
    assert "step 2/5" in line and "reward 0.625" in line and "success 0.50" in line
    assert "staleness 1.00" in line


def test_progress_line_without_rollout_numbers_shows_a_dash():
    # an async step that trained rollouts finished before the previous step ended
    line = _line({"loss/total": 0.1, "groups_finished": 0.0})
    assert "reward - success -" in line and "nan" not in line
