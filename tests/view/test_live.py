"""Live: pages follow a run as it grows, without a reload (the fixture's lines appended to a
new run folder; and a real tiny-model `agentrl train --view`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.orchestrator.test_train import BASE
from tests.view.conftest import FIXTURE

REPO = Path(__file__).resolve().parents[2]


def _split_at_second_step(lines: list[str]) -> int:
    """Index of the metrics line after which step 2's events begin."""
    trained = [i for i, line in enumerate(lines) if '"event": "BatchTrained"' in line]
    return trained[0] + 1


def test_follow_shows_new_steps_without_reload(page: Page, tmp_path: Path) -> None:
    from agentrl.view import serve_in_thread

    run = tmp_path / "growing"
    run.mkdir()
    (run / "config.yaml").write_text((FIXTURE / "config.yaml").read_text())
    metrics = (FIXTURE / "metrics.jsonl").read_text().splitlines(keepends=True)
    groups = (FIXTURE / "trajectories.jsonl").read_text().splitlines(keepends=True)
    cut = _split_at_second_step(metrics)
    (run / "metrics.jsonl").write_text("".join(metrics[:cut]))
    (run / "trajectories.jsonl").write_text("".join(groups[:2]) + groups[2][:100])  # torn line
    server = serve_in_thread(run, 0, follow=True)
    try:
        page.goto(server.url)
        page.evaluate("() => { window.__notReloaded = true; }")
        expect(page.locator("#steps-table tr.step-row")).to_have_count(1)
        expect(page.locator("#n-groups")).to_have_text("2")
        expect(page.locator("#run-state")).to_have_text("live")
        with (run / "trajectories.jsonl").open("a") as f:  # the writer finishes its line
            f.write(groups[2][100:] + "".join(groups[3:]))
        with (run / "metrics.jsonl").open("a") as f:
            f.write("".join(metrics[cut:]))
        expect(page.locator("#steps-table tr.step-row")).to_have_count(3)
        expect(page.locator("#steps-table")).to_have_attribute("data-groups", str(len(groups)))
        # the summary cards follow too, not only the table
        expect(page.locator("#n-groups")).to_have_text(str(len(groups)))
        expect(page.locator("#summary .state-text")).to_have_text("completed")
        expect(page.locator("#run-state")).to_have_text("completed")
        assert page.evaluate("() => window.__notReloaded === true")
        page.goto(f"{server.url}groups?run=growing&step=2")
        expect(page.locator("tr.group-row")).to_have_count(2)
    finally:
        server.stop()


@pytest.mark.integration  # a real training in a subprocess: ~70 s on 2 shared cores
@pytest.mark.timeout(600)
def test_train_with_view_serves_the_run_live(page: Page, tmp_path: Path) -> None:
    cfg = tmp_path / "live.yaml"
    cfg.write_text("{}\n")
    # enough steps that the page (polling each second) sees some before the run, and the
    # server with it, ends: a tiny step takes 50-100 ms (12 steps once ran in 0.85 s, all
    # between two polls), so 150 steps last several seconds on any CPU kind
    overrides = [*BASE, "orchestrator.max_steps=150", "logging.tensorboard=false"]
    args = [
        sys.executable,
        "-m",
        "agentrl.cli",
        "train",
        str(cfg),
        "--run-dir",
        str(tmp_path / "run"),
    ]
    args += [a for o in overrides for a in ("--set", o)]
    args += ["--view", "--view-port", "0", "--no-summary"]
    proc = subprocess.Popen(
        args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        url = None
        assert proc.stdout is not None
        for line in proc.stdout:
            m = re.search(r"agentrl view: (http://127\.0\.0\.1:\d+/)", line)
            if m:
                url = m.group(1)
                break
        assert url, "train --view printed no URL"
        page.goto(url)
        page.evaluate("() => { window.__notReloaded = true; }")
        first = page.locator("#steps-table tr.step-row").count()
        rows = page.locator("#steps-table tr.step-row:not(:has(.pending))")
        expect(rows.first).to_be_visible(timeout=400_000)  # the page polls; no reload
        assert page.evaluate("() => window.__notReloaded === true")
        page.goto("about:blank")  # stop polling: the server ends with the training
        assert first == 0, "the run had trained before the page opened"
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
