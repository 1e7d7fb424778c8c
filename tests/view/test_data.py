"""The viewer's data layer and HTTP edges, without a browser: incremental reads of growing
files, folders of runs, rollout folders, and clear errors for bad input."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from agentrl.cli import app as cli
from agentrl.errors import DatasetError
from agentrl.view import create_app
from agentrl.view.catalog import Catalog
from agentrl.view.data import Filters, JsonlTail
from tests.view.conftest import FIXTURE


def test_tail_reads_only_complete_new_lines(tmp_path: Path) -> None:
    f = tmp_path / "x.jsonl"
    tail = JsonlTail(f)
    assert tail.read_new() == []  # absent: nothing yet
    f.write_bytes(b'{"a": 1}\n{"b":')
    assert [line for _, line in tail.read_new()] == [b'{"a": 1}\n']
    assert tail.read_new() == []  # the torn line waits for its newline
    with f.open("ab") as w:
        w.write(b' 2}\n\n{"c": 3}\n')
    got = tail.read_new()
    assert [line for _, line in got] == [b'{"b": 2}\n', b'{"c": 3}\n']
    assert got[0][0] == len(b'{"a": 1}\n')  # byte offsets for reading a line back
    with f.open("ab") as w:
        w.write(b'{"long": "' + b"x" * 50 + b'"}\n{"d": 4}\n')
    assert [line[:9] for _, line in tail.read_new(max_bytes=8)] == [b'{"long": ']  # read whole
    assert [line for _, line in tail.read_new(max_bytes=8)] == [b'{"d": 4}\n']


def test_run_index_of_the_fixture() -> None:
    cat = Catalog(FIXTURE)
    assert cat.refresh() and not cat.refresh()  # the second look finds nothing new
    run = cat.get("fixture_run")
    assert [g.step for g in run.groups] == [1, 1, 2, 2, 3, 3, 3]
    dropped = [g for g in run.groups if not g.trained]
    assert [g.dropped for g in dropped] == ["dropped_all_equal"] and dropped[0].equal_rewards
    assert dropped[0].outcome == "dropped: dropped_all_equal"
    assert run.summary()["trajectories"] == 28 and run.summary()["state"] == "completed"
    tree = next(g for g in run.groups if g.is_tree)
    raw = run.group(tree.group_id)
    assert raw["group_id"] == tree.group_id and len(raw["trajectories"]) == 4
    assert len(run.select(Filters(status="infra_error"))) == 1
    lines = (FIXTURE / "trajectories.jsonl").read_text().lower().splitlines()
    maldives = sum("maldives" in line for line in lines)
    assert maldives >= 1 and len(run.select(Filters(q="MALDIVES"))) == maldives
    assert run.select(Filters(step=2, task=run.groups[2].task_id))[0].step == 2
    assert [g.group_id for g in run.select(Filters(dropped=True))] == [dropped[0].group_id]
    assert dropped[0] not in run.select(Filters(mixed=True))
    by_reward = run.select(Filters(sort="-reward"))
    assert [g.reward_mean for g in by_reward] == sorted(
        (g.reward_mean for g in run.groups), reverse=True
    )
    series = run.metric_series()
    assert series["step"] == [1, 2, 3] and len(series["reward/mean"]) == 3


def test_the_headline_reward_is_every_finished_groups_recomputed_from_the_trace() -> None:
    """trace/reward_mean per step: the mean of the group means (infra errors left out) of the
    groups whose GroupFinished falls in that step, the dropped ones too; it is the number
    the orchestrator logged as reward_mean, and not the trained batch's reward/mean."""
    from agentrl.view.series import metric_payload

    cat = Catalog(FIXTURE)
    cat.refresh()
    payload = metric_payload(cat.get("fixture_run"))
    events = [json.loads(line) for line in (FIXTURE / "metrics.jsonl").open()]
    finished = [e["step"] + 1 for e in events if e["event"] == "GroupFinished"]
    groups = [json.loads(line) for line in (FIXTURE / "trajectories.jsonl").open()]
    by_step: dict[int, list[float]] = {}
    for step, g in zip(finished, groups, strict=True):
        valid = [t["reward"] for t in g["trajectories"] if t["status"] != "infra_error"]
        by_step.setdefault(step, []).append(sum(valid) / len(valid))
    want = [sum(v) / len(v) for _, v in sorted(by_step.items())]
    got = payload["series"]["trace/reward_mean"]
    assert got == pytest.approx(want)
    logged = [e["metrics"]["reward_mean"] for e in events if e["event"] == "BatchTrained"]
    assert got == pytest.approx(logged)
    trained = [e["metrics"]["reward/mean"] for e in events if e["event"] == "BatchTrained"]
    assert trained != pytest.approx(got)  # dynamic sampling dropped a group at step 3
    assert all(len(q) == 5 and q[0] <= q[2] <= q[4] for q in payload["dists"]["reward"])
    assert "grad_norm" in payload["keys"] and "eval/mean_reward" in payload["keys"]


def test_call_outcomes_and_cut_answers() -> None:
    from agentrl.view.outcomes import call_error_text, call_outcome, cut_at_limit

    ok = {"name": "search", "result": "1. Vienna ..."}
    raised = {"name": "lookup", "error": "error: tool 'lookup' failed: KeyError: 'x'"}
    ran_failed = {
        "name": "python",
        "result": "Traceback ...",
        "error": "SyntaxError: '(' was never closed",
    }
    old_trace = {
        "name": "python",
        "result": "Traceback (most recent call last):\n  File ...\nTypeError: bad operand",
    }
    timeout = {
        "name": "python",
        "error": "error: tool 'python' timed out after 5s",
        "timed_out": True,
    }
    infra = {"name": "python", "error": "error: the sandbox failed", "infra_error": True}
    unparsed = {"name": "", "error": "error: invalid JSON in tool call"}
    invalid = {"name": "search", "error": "error: argument 'query' is required"}
    got = [
        call_outcome(c)
        for c in (ok, raised, ran_failed, old_trace, timeout, infra, unparsed, invalid)
    ]
    assert got == ["ok", "error", "error", "error", "timeout", "infra", "parse", "parse"]
    assert call_error_text(old_trace) == "TypeError: bad operand"
    syntax = {
        "name": "python",
        "result": '  File "<stdin>", line 1\n    print(1\nSyntaxError: never closed',
    }
    document = {"name": "search", "result": "1. Python docs\nValueError: raised when ..."}
    assert [call_outcome(c) for c in (syntax, document)] == ["error", "ok"]
    cut = {"status": "ok", "turns": [{"finish_reason": "length", "tool_calls": []}]}
    stopped = {"status": "ok", "turns": [{"finish_reason": "stop", "tool_calls": []}]}
    calling = {"status": "ok", "turns": [{"finish_reason": "length", "tool_calls": [ok]}]}
    assert [cut_at_limit(t) for t in (cut, stopped, calling)] == [True, False, False]


def test_held_out_tasks_per_evaluation_and_config_diff() -> None:
    from agentrl.view.series import config_diff, eval_table

    cat = Catalog(FIXTURE)
    cat.refresh()
    steps, rows = eval_table(cat.get("fixture_run"))
    assert steps == [2, 3] and len(rows) == 2  # two held-out tasks, evaluated twice
    assert all(sorted(r["by_step"]) == [2, 3] and r["target"] for r in rows)
    a = {"learner": {"lr": 1e-3, "batch_groups": 2}, "env": {"name": "x"}}
    b = {"learner": {"lr": 5e-4, "batch_groups": 2}, "seed": 1}
    assert config_diff(a, b) == [
        ("env.name", "x", "(absent)"),
        ("learner.lr", 1e-3, 5e-4),
        ("seed", "(absent)", 1),
    ]


def test_a_folder_of_runs_and_a_rollout_folder(tmp_path: Path) -> None:
    shutil.copytree(FIXTURE, tmp_path / "runs" / "a")
    rollout = tmp_path / "runs" / "b"
    rollout.mkdir()
    shutil.copy(FIXTURE / "trajectories.jsonl", rollout / "trajectories.jsonl")  # no metrics
    cat = Catalog(tmp_path / "runs")
    cat.refresh()
    assert sorted(cat.runs) == ["a", "b"]
    b = cat.get("b")
    assert b.summary()["state"] == "rollout" and b.summary()["steps"] == 0
    assert [g.step for g in b.groups] == [0, 0, 1, 1, 2, 2, 2]  # from the weight versions
    shutil.copytree(FIXTURE, tmp_path / "runs" / "c")  # a run started later shows up
    cat.refresh()
    assert "c" in cat.runs and cat.get("c").num_trajectories == 28


def test_bad_folders_say_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no run folder at"):
        Catalog(tmp_path / "missing")
    with pytest.raises(DatasetError, match=r"holds no run: expected metrics\.jsonl"):
        Catalog(tmp_path)


def test_advantages_are_the_recorded_ones_or_not_recorded(tmp_path: Path) -> None:
    shutil.copytree(FIXTURE, tmp_path / "r")
    (tmp_path / "r" / "advantages.jsonl").unlink()  # as written before they were recorded
    cat = Catalog(tmp_path / "r")
    cat.refresh()
    run = cat.get("r")
    trajs = [t for g in run.groups for t in g.trajectories]
    assert {t.advantage_text for t in trajs} == {"not recorded"}  # never recomputed
    a, b = trajs[0].traj_id, trajs[1].traj_id
    with (tmp_path / "r" / "advantages.jsonl").open("w") as f:  # as TraceWriter writes it
        f.write(json.dumps({"step": 1, "estimator": "rloo", "advantages": {a: 0.25, b: None}}))
        f.write("\n")
    assert cat.refresh()
    assert (trajs[0].advantage, trajs[0].estimator) == (0.25, "rloo")
    assert trajs[0].advantage_text == "+0.250" and trajs[0].advantage_label == "advantage (rloo)"
    assert trajs[1].advantage_text == "not trained" and trajs[2].advantage_text == "not recorded"
    # a folder read from scratch attaches advantages to groups read after them
    again = Catalog(tmp_path / "r")
    again.refresh()
    assert again.get("r").by_traj[a][0].trajectories[0].advantage == 0.25


def test_a_folder_of_runs_overlays_their_curves(tmp_path: Path) -> None:
    for name in ("a", "b"):
        shutil.copytree(FIXTURE, tmp_path / name)
    app = create_app(tmp_path)
    try:
        client = TestClient(app)
        page = client.get("/?sel=a")
        assert (
            page.status_code == 200
            and 'value="b"' in page.text
            and "data-runs='[\"a\"]'" in page.text
        )
        series = client.get("/api/metrics?run=a&run=b").json()
        assert sorted(series) == ["a", "b"] and series["a"]["series"]["step"] == [1, 2, 3]
        assert client.get("/run").status_code == 400  # two runs: which one?
    finally:
        app.state.indexer.stop()


def test_http_errors_name_the_bad_value() -> None:
    app = create_app(FIXTURE)
    client = TestClient(app)
    r = client.get("/traj?run=fixture_run&id=nope")
    assert r.status_code == 404 and "no trajectory &#39;nope&#39;" in r.text
    tid = json.loads((FIXTURE / "trajectories.jsonl").open().readline())["trajectories"][0]
    r = client.get(f"/traj?run=fixture_run&id={tid['traj_id']}&color=rainbow")
    assert r.status_code == 400 and "color must be one of logprob" in r.text
    assert client.get("/run?run=other").status_code == 404
    assert client.get("/groups?run=fixture_run&page=x").status_code == 400
    assert client.get("/static/htmx.min.js").text.startswith("/*! htmx")
    app.state.indexer.stop()


def test_cli_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(cli, ["view", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "no run folder at" in r.output
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = runner.invoke(cli, ["view", str(FIXTURE), "--port", str(port)])
    assert r.exit_code == 2 and f"port {port} on 127.0.0.1 is in use" in r.output
    r = runner.invoke(cli, ["view", str(FIXTURE), "--port", "70000"])
    assert r.exit_code == 2 and "--port must be 0..65535" in r.output
