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
    assert [g.step for g in run.groups] == [1, 1, 2, 2] and all(g.trained for g in run.groups)
    assert run.summary()["trajectories"] == 16 and run.summary()["state"] == "completed"
    tree = next(g for g in run.groups if g.is_tree)
    raw = run.group(tree.group_id)
    assert raw["group_id"] == tree.group_id and len(raw["trajectories"]) == 4
    assert len(run.select(Filters(status="infra_error"))) == 1
    assert len(run.select(Filters(q="maldives"))) == 2  # case-insensitive text search
    assert run.select(Filters(step=2, task=run.groups[0].task_id))[0].step == 2
    series = run.metric_series()
    assert series["step"] == [1, 2] and len(series["reward/mean"]) == 2


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
    assert [g.step for g in b.groups] == [0, 0, 1, 1]  # from the weight versions
    shutil.copytree(FIXTURE, tmp_path / "runs" / "c")  # a run started later shows up
    cat.refresh()
    assert "c" in cat.runs and cat.get("c").num_trajectories == 16


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
        assert sorted(series) == ["a", "b"] and series["a"]["series"]["step"] == [1, 2]
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
