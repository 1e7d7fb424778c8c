"""The viewer in a real browser over the fixture run (a real two-step tiny ARPO training
with a branched group, an infra_error, a parse error and the same tasks at both steps)."""

from __future__ import annotations

import json
import re

from playwright.sync_api import Page, expect

from tests.view.conftest import FIXTURE, shot

RUN = "fixture_run"


def _ids() -> dict[str, str]:
    """Facts of the fixture, read from its trace (so a rebuilt fixture keeps the tests)."""
    groups = [json.loads(line) for line in (FIXTURE / "trajectories.jsonl").open()]
    trajs = [(g, t) for g in groups for t in g["trajectories"]]
    parse = next(t for g, t in trajs if any(tn["parse_errors"] for tn in t["turns"]))
    infra = next((g, t) for g, t in trajs if t["status"] == "infra_error")
    branch = next((g, t) for g, t in trajs if t["parent_id"])
    return {
        "parse_traj": parse["traj_id"],
        "infra_group": infra[0]["group_id"],
        "tree_group": branch[0]["group_id"],
        "branch_traj": branch[1]["traj_id"],
        "groups": str(len(groups)),
    }


IDS = _ids()


def test_run_page_shows_summary_curves_steps_and_config(page: Page, fixture_server) -> None:
    page.goto(fixture_server.url)
    expect(page.locator("h1")).to_have_text(RUN)
    expect(page.locator("#summary")).to_contain_text("steps trained")
    expect(page.locator("#n-groups")).to_have_text(IDS["groups"])
    # the curves are drawn by uPlot from /api/metrics: one canvas per recorded metric
    expect(page.locator(".chart[data-metric='reward/mean'] canvas")).to_have_count(1)
    expect(page.locator(".chart[data-metric='entropy'] canvas")).to_have_count(1)
    expect(page.locator(".chart[data-metric='eval/reward_mean']")).to_contain_text("not recorded")
    expect(page.locator("#steps-table tr.step-row")).to_have_count(2)
    page.locator("#config summary").click()
    expect(page.locator("#config pre")).to_contain_text("tree_grpo")
    shot(page, "run")


def test_groups_filters_keep_their_state_in_the_url(page: Page, fixture_server) -> None:
    page.goto(fixture_server.url)
    page.locator("#steps-table a", has_text="step 2").click()
    expect(page).to_have_url(re.compile(r"/groups\?run=fixture_run&step=2$"))
    expect(page.locator("section.group")).to_have_count(2)
    expect(page.locator("section.group .badge.equal").first).to_have_text("all rewards equal")
    sample = page.locator("section.group a.sample").first
    for label in ("reward", "advantage", "length", "turns", "tool calls", "stop", "versions"):
        expect(sample.locator("dt", has_text=label).first).to_be_visible()
    shot(page, "groups")

    page.locator("#f-step").select_option("")
    page.locator("#f-status").select_option("infra_error")
    page.locator("#f-apply").click()
    expect(page).to_have_url(re.compile(r"status=infra_error"))
    expect(page.locator("section.group")).to_have_count(1)
    expect(page.locator(f"#group-{IDS['infra_group']}")).to_be_visible()
    expect(page.locator("a.sample.match")).to_have_count(1)
    expect(page.locator("a.sample.match")).to_contain_text("infra_error")

    url = page.url  # a shared link opens the same view
    page.goto(url)
    expect(page.locator("#f-status")).to_have_value("infra_error")
    expect(page.locator("section.group")).to_have_count(1)

    page.goto(f"{fixture_server.url}groups?run={RUN}&parse=1")
    expect(page.locator("a.sample.match")).to_have_count(2)  # the malformed call and its branch
    page.goto(f"{fixture_server.url}groups?run={RUN}&q=Maldives")
    expect(page.locator("section.group")).to_have_count(2)
    expect(page.locator("#f-tool option")).to_have_text(["any", "search"])
    page.goto(f"{fixture_server.url}groups?run={RUN}&tool=search&rmin=0.5")
    expect(page.locator("#count")).to_have_text(re.compile("^0 groups"))
    page.goto(f"{fixture_server.url}groups?run={RUN}&rmin=abc")
    expect(page.locator("#error")).to_contain_text("rmin must be a number (got 'abc')")
    page.guard.errors.clear()  # the 400 of a bad filter is what this step asks for


def test_trajectory_conversation_heatmap_and_raw_json(page: Page, fixture_server) -> None:
    page.goto(f"{fixture_server.url}groups?run={RUN}&parse=1")
    page.locator("a.sample.match").first.click()
    expect(page).to_have_url(re.compile(r"/traj\?"))
    expect(page.locator(".msg.prompt")).to_have_count(1)
    expect(page.locator(".msg.assistant").first).to_contain_text("turn 0")
    expect(page.locator(".msg.observation").first).to_be_visible()
    expect(page.locator("tr.parse-error")).to_contain_text("invalid JSON in tool call")
    tokens = page.locator("#heatmap .tok.model")
    assert tokens.count() > 0
    expect(tokens.first).to_have_attribute("title", re.compile(r"log-prob -?\d"))
    expect(page.locator("#heatmap .tok.prompt").first).to_be_visible()
    shot(page, "trajectory")

    page.locator("#heat-color").select_option("entropy")
    expect(page).to_have_url(re.compile(r"color=entropy"))
    expect(page.locator(".scale")).to_contain_text("range")
    colored = page.locator("#heatmap .tok.model").first
    assert colored.get_attribute("style") != "background:transparent"
    colored.hover()
    expect(colored).to_have_attribute("title", re.compile(r"entropy \d"))
    shot(page, "heatmap")
    page.locator("#heat-color").select_option("staleness")
    expect(page.locator(".scale")).to_contain_text("range")

    page.locator("#raw summary").click()
    expect(page.locator("#raw pre")).to_contain_text(f'"traj_id": "{IDS["parse_traj"]}"')


def test_infra_error_shows_its_message(page: Page, fixture_server) -> None:
    page.goto(f"{fixture_server.url}groups?run={RUN}&status=infra_error")
    page.locator("a.sample.match").click()
    expect(page.locator("#traj-error")).to_contain_text("search index unavailable")
    expect(page.locator("#traj-summary")).to_contain_text("infra_error")


def test_arpo_tree_opens_a_path(page: Page, fixture_server) -> None:
    page.goto(f"{fixture_server.url}group?run={RUN}&id={IDS['tree_group']}")
    expect(page.locator("svg#tree a.tree-node")).to_have_count(4)
    expect(page.locator("svg#tree circle.fork")).to_have_count(2)
    branch = page.locator(f"svg#tree a.tree-node[data-traj='{IDS['branch_traj']}']")
    expect(branch.locator("text")).to_contain_text(re.compile(r"fork @turn 1 ΔH [+-]\d"))
    expect(branch.locator("text")).to_contain_text("A=")
    shot(page, "tree")
    branch.locator("text").click()
    expect(page).to_have_url(re.compile(r"/traj\?"))
    expect(page.locator("main")).to_contain_text("branch of")
    expect(page.locator("#traj-advantage")).to_contain_text("advantage (tree_grpo)")


def test_step_n_vs_step_m(page: Page, fixture_server) -> None:
    page.goto(fixture_server.url)
    page.locator("#nav-compare").click()
    sides = page.locator("#compare .side")
    expect(sides).to_have_count(2)
    expect(sides.nth(0).locator("h2")).to_have_text("step 1")
    expect(sides.nth(1).locator("h2")).to_have_text("step 2")
    expect(sides.nth(0).locator(".cmp-sample")).to_have_count(4)
    expect(sides.nth(1).locator(".cmp-sample")).to_have_count(4)
    shot(page, "compare")
    task = page.locator("#c-task option").nth(1).get_attribute("value")
    page.locator("#c-task").select_option(task)
    expect(page).to_have_url(re.compile("task="))
    expect(page.locator("#compare .side").nth(1).locator(".cmp-sample")).to_have_count(4)


def test_the_guard_catches_foreign_requests_and_console_errors(browser, fixture_server) -> None:
    from tests.view.conftest import Guard

    context = browser.new_context()
    guard = Guard()

    def on_route(route):
        guard.foreign.append(route.request.url)
        route.abort()

    context.route("http://example.com/**", on_route)
    page = context.new_page()
    page.on("console", lambda m: guard.errors.append(m.text) if m.type == "error" else None)
    page.goto(fixture_server.url)
    page.evaluate("() => { console.error('boom'); fetch('http://example.com/x').catch(() => {}); }")
    page.wait_for_function("() => true")
    context.close()
    assert "boom" in guard.errors and guard.foreign == ["http://example.com/x"]


def test_a_run_trained_with_rloo_shows_rloos_advantages(page: Page, tmp_path) -> None:
    """A real run (the learner in its own process) records the advantages it trained with;
    the view shows those, labelled rloo: each equals r_i minus the mean of the others."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from agentrl.view import serve_in_thread
    from tests.orchestrator.test_train import BASE

    overrides = [
        *BASE,
        "algorithm.advantage=rloo",
        "orchestrator.max_steps=1",
        "orchestrator.max_staleness=0",
        "orchestrator.learner_worker=process",
    ]
    (tmp_path / "c.yaml").write_text("{}\n")
    out = tmp_path / "rloo_run"
    root = Path(__file__).resolve().parents[2]
    # `agentrl train` in its own process: playwright's event loop holds this thread
    done = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", str(tmp_path / "c.yaml")]
        + [arg for o in overrides for arg in ("--set", o)]
        + ["--run-dir", str(out), "--no-summary"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    recorded = [json.loads(line) for line in (out / "advantages.jsonl").open()]
    assert [r["step"] for r in recorded] == [1] and recorded[0]["estimator"] == "rloo"
    groups = [json.loads(line) for line in (out / "trajectories.jsonl").open()]
    trained = [g for g in groups if g["trajectories"][0]["traj_id"] in recorded[0]["advantages"]]
    assert len(trained) == 2
    # the group with the most spread rewards: its advantages are far from zero
    group = max(trained, key=lambda g: len({t["reward"] for t in g["trajectories"]}))
    rewards = [t["reward"] for t in group["trajectories"]]
    k = len(rewards)
    expected = [r - (sum(rewards) - r) / (k - 1) for r in rewards]

    server = serve_in_thread(out, 0, follow=False)
    try:
        page.goto(f"{server.url}group?run=rloo_run&id={group['group_id']}")
        cells = page.locator("a.sample dd.adv")
        expect(cells).to_have_count(k)
        for i, want in enumerate(expected):
            expect(cells.nth(i)).to_have_text(f"{want:+.3f} rloo")
        traj = group["trajectories"][0]["traj_id"]
        page.goto(f"{server.url}traj?run=rloo_run&id={traj}")
        expect(page.locator("#traj-advantage")).to_contain_text("advantage (rloo)")
        expect(page.locator("#traj-advantage b")).to_have_text(f"{expected[0]:+.3f}")
        shot(page, "rloo_advantages")
    finally:
        server.stop()


def test_an_old_run_says_its_advantages_were_not_recorded(page: Page, tmp_path) -> None:
    import shutil

    from agentrl.view import serve_in_thread

    old = tmp_path / RUN
    shutil.copytree(FIXTURE, old)
    (old / "advantages.jsonl").unlink()  # as a run wrote it before advantages were recorded
    server = serve_in_thread(old, 0, follow=False)
    try:
        page.goto(f"{server.url}traj?run={RUN}&id={IDS['parse_traj']}")
        expect(page.locator("#traj-advantage")).to_contain_text("not recorded")
        page.goto(f"{server.url}group?run={RUN}&id={IDS['tree_group']}")
        expect(page.locator("a.sample dd.adv").first).to_have_text("not recorded")
        expect(page.locator("svg#tree a.tree-node text").first).not_to_contain_text("A=")
    finally:
        server.stop()
