"""The progress line of a trained step; metric writers thinned by ``logging.log_every``."""

from __future__ import annotations

import io
import json

from rich.console import Console

from agentrl.config import LoggingConfig
from agentrl.run.events import (
    BatchTrained,
    EvalFinished,
    EventBus,
    EveryNSteps,
    JsonlMetrics,
    ProgressDisplay,
    RunFinished,
    step_metrics,
)
from agentrl.run.subscribers import subscribers_for


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


def test_progress_is_one_plain_line_per_step_when_not_a_terminal():
    # a log file or a pipe: rich cannot ask for a width and used to wrap at 80 columns
    out = io.StringIO()
    display = ProgressDisplay(max_steps=400, console=Console(file=out, width=40))
    metrics = {"reward_mean": 0.5, "success_rate": 0.25, "rollout_tokens_per_s": 1234.0}
    for step in (1, 2):
        display(BatchTrained(step=step, version=step, metrics={**metrics, "loss/total": 0.1}))
    display(RunFinished(step=2, reason="completed"))
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and len(lines[0]) > 40
    assert lines[0].startswith("step 1/400 reward 0.500") and lines[0].endswith("s")
    assert "\x1b" not in out.getvalue()  # no colour codes in a file


def _jsonl_steps(path) -> list[int]:
    rows = [json.loads(line) for line in path.open()]
    return [r["step"] for r in rows if r["event"] == "BatchTrained"]


def test_log_every_writes_every_nth_step_and_the_last(tmp_path):
    jsonl = EveryNSteps(JsonlMetrics(tmp_path / "m.jsonl"), n=3, max_steps=7)
    for step in range(1, 8):
        jsonl(BatchTrained(step=step, version=step, metrics={"loss/total": 1.0}))
    jsonl(RunFinished(step=7, reason="completed"))
    jsonl.close()
    assert _jsonl_steps(tmp_path / "m.jsonl") == [3, 6, 7]


def test_log_every_keeps_the_last_step_of_an_interrupted_run(tmp_path):
    bus = EventBus()
    bus.subscribe(EveryNSteps(JsonlMetrics(tmp_path / "m.jsonl"), n=5, max_steps=100))
    for step in range(1, 8):
        bus.publish(BatchTrained(step=step, version=step, metrics={"loss/total": 1.0}))
    bus.publish(RunFinished(step=7, reason="interrupted"))
    bus.close()
    assert _jsonl_steps(tmp_path / "m.jsonl") == [5, 7]


def test_subscribers_for_thins_metrics_not_the_trace(tmp_path):
    cfg = LoggingConfig(log_every=2, progress=False)
    subscribers = subscribers_for(cfg, tmp_path, max_steps=4)
    assert [type(fn).__name__ for fn in subscribers] == ["EveryNSteps", "TraceWriter"]
    for fn in subscribers:
        fn.close()
    subscribers = subscribers_for(LoggingConfig(trace=False), tmp_path, max_steps=4)
    assert [type(fn).__name__ for fn in subscribers] == ["JsonlMetrics", "ProgressDisplay"]
    subscribers[0].close()


def test_step_metrics_prefix_other_events_by_name():
    assert step_metrics(BatchTrained(step=3, version=3, metrics={"loss/total": 1})) == (
        3,
        {"loss/total": 1.0},
    )
    assert step_metrics(EvalFinished(step=4, metrics={"pass@1": 0.5, "note": "x"})) == (
        4,
        {"eval/pass@1": 0.5},
    )
    assert step_metrics(RunFinished(step=4, reason="completed")) is None


def test_gateway_prefix_breaks_are_a_group_number_only_for_gateway_groups():
    from agentrl.run.events import summarize_group
    from agentrl.types import Trajectory, TrajectoryGroup

    def sample(started_by: str) -> Trajectory:
        return Trajectory(metadata={"gateway": {"started_by": started_by}})

    broken = "prefix break: the agent changed the model's reply (message 2)"
    group = TrajectoryGroup("t", [sample("first call"), sample(broken), sample("first call")])
    assert summarize_group(group)["gateway/prefix_breaks"] == 1.0
    plain = TrajectoryGroup("t", [Trajectory(), Trajectory()])
    assert "gateway/prefix_breaks" not in summarize_group(plain)
