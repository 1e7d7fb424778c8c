"""`agentrl sandbox check` and `agentrl sandbox exec`."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from agentrl.cli import app

from .conftest import needs_bwrap

runner = CliRunner()


@needs_bwrap
def test_exec_json(tmp_path) -> None:
    script = tmp_path / "hello.py"
    script.write_text("import sys\nprint('hello', 6 * 7)\nprint('warn', file=sys.stderr)\n")
    res = runner.invoke(app, ["sandbox", "exec", str(script), "--backend", "bwrap", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["stdout"] == "hello 42\n" and data["stderr"] == "warn\n"
    assert data["status"] == "ok" and data["exit_code"] == 0 and data["backend"] == "bwrap"
    assert {"wall_s", "cpu_s", "truncated", "state_lost"} <= set(data)


@needs_bwrap
def test_exec_timeout_and_plain_output(tmp_path) -> None:
    script = tmp_path / "spin.py"
    script.write_text("print('start', flush=True)\nwhile True:\n    pass\n")
    res = runner.invoke(app, ["sandbox", "exec", str(script), "--timeout", "1", "--json"])
    assert res.exit_code == 1
    data = json.loads(res.stdout)
    assert data["status"] == "timeout" and data["stdout"] == "start\n"
    res = runner.invoke(app, ["sandbox", "exec", str(script), "-t", "1"])
    assert res.exit_code == 1 and "status=timeout" in res.output


def test_exec_bad_backend_names_the_fix(tmp_path) -> None:
    script = tmp_path / "a.py"
    script.write_text("pass\n")
    res = runner.invoke(app, ["sandbox", "exec", str(script), "--backend", "bwarp"])
    assert res.exit_code == 2 and "did you mean 'bwrap'" in res.output
    res = runner.invoke(app, ["sandbox", "exec", str(script), "--backend", "subprocess"])
    assert res.exit_code == 2 and "allow_insecure" in res.output


@needs_bwrap
def test_check_table() -> None:
    res = runner.invoke(app, ["sandbox", "check"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "bwrap" in out and "docker" in out and "subprocess" in out
    bwrap_row = next(line for line in out.splitlines() if "bwrap" in line)
    assert "yes" in bwrap_row and "cold start" in bwrap_row
