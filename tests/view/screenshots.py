"""Screenshots of every page of `agentrl view` over a run, for docs/view.md.

    python -m tests.view.screenshots RUN_DIR [OUT=docs/view]

The same browser as the tests (Debian's chromium through playwright), at 1280x900; the
pages shown are the run (with two more metrics picked), the groups list, a trajectory with a
failed tool call (else the one with the most tool calls) and its heatmap by entropy, a
branched group's tree (the first group otherwise) and the comparison page.
"""

from __future__ import annotations

import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

from agentrl.view import serve_in_thread
from tests.view.conftest import chromium_path


def take(run_dir: Path, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    server = serve_in_thread(run_dir, 0, follow=False)
    try:
        run = next(iter(server.app.state.catalog.runs.values()))
        q = f"run={run.name}"
        tree = next((g for g in run.groups if g.is_tree), run.groups[0])
        busiest = max(
            (t for g in run.groups for t in g.trajectories if t.status == "ok"),
            key=lambda t: (t.calls_failed, t.tool_calls, t.reward, t.turns),
        )
        pages = {
            "run": f"run?{q}&m=trace/tool_success_rate&m=dist:reward&m=grad_norm&m=is_ratio/max",
            "groups": f"groups?{q}",
            "trajectory": f"traj?{q}&id={busiest.traj_id}",
            "heatmap": f"traj?{q}&id={busiest.traj_id}&color=entropy",
            "tree": f"group?{q}&id={tree.group_id}",
            "compare": f"compare?{q}",
        }
        saved = []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            for name, path in pages.items():
                page.goto(server.url + path)
                if name == "run":
                    page.wait_for_selector(".chart[data-metric='is_ratio/max'] canvas")
                    page.locator("#metric-search").fill("grad")
                if name == "heatmap":
                    page.locator("#heatmap").scroll_into_view_if_needed()
                    page.screenshot(path=str(out / f"{name}.png"))  # the tokens, not the top
                else:
                    page.screenshot(path=str(out / f"{name}.png"), full_page=name != "groups")
                saved.append(out / f"{name}.png")
            browser.close()
        return saved
    finally:
        server.stop()


if __name__ == "__main__":
    for path in take(Path(sys.argv[1]), Path(sys.argv[2] if len(sys.argv) > 2 else "docs/view")):
        print(path)
