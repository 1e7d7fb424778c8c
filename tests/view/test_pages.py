"""The viewer in a real browser over the fixture run (a real three-step tiny ARPO training:
a fresh task per group, branched groups, an infra_error, a parse error, a tool that raises,
a group dynamic sampling dropped, and held-out evaluations at steps 2 and 3)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from playwright.sync_api import Page, expect

from tests.view.conftest import FIXTURE, shot

RUN = "fixture_run"
GROUPS = [json.loads(line) for line in (FIXTURE / "trajectories.jsonl").open()]
EVENTS = [json.loads(line) for line in (FIXTURE / "metrics.jsonl").open()]
TRAJS = [(g, t) for g in GROUPS for t in g["trajectories"]]


def _calls(t: dict) -> list[dict]:
    return [c for tn in t["turns"] for c in tn["tool_calls"]]


def _ids() -> dict[str, str]:
    """Facts of the fixture, read from its trace (so a rebuilt fixture keeps the tests)."""
    parse = next(t for g, t in TRAJS if any(tn["parse_errors"] for tn in t["turns"]))
    infra = next((g, t) for g, t in TRAJS if t["status"] == "infra_error")
    branch = next(
        (g, t) for g, t in TRAJS if t["parent_id"] and t["status"] == "ok" and t["reward"] > 0
    )
    raised = next(
        (g, t) for g, t in TRAJS if t["status"] == "ok" and any(c["error"] for c in _calls(t))
    )
    cut = next(
        t for g, t in TRAJS if t["status"] == "ok" and t["turns"][-1]["finish_reason"] == "length"
    )
    return {
        "parse_traj": parse["traj_id"],
        "infra_group": infra[0]["group_id"],
        "tree_group": branch[0]["group_id"],
        "branch_traj": branch[1]["traj_id"],
        "raised_group": raised[0]["group_id"],
        "raised_traj": raised[1]["traj_id"],
        "cut_traj": cut["traj_id"],
        "groups": str(len(GROUPS)),
    }


IDS = _ids()


def _rollout_reward_from_the_trace() -> list[float]:
    """Per step, the mean of the group means (infra errors left out) of every group that
    finished during it: the n-th trace line is the n-th GroupFinished event."""
    finished = [e["step"] + 1 for e in EVENTS if e["event"] == "GroupFinished"]
    by_step: dict[int, list[float]] = {}
    for step, g in zip(finished, GROUPS, strict=True):
        valid = [t["reward"] for t in g["trajectories"] if t["status"] != "infra_error"]
        by_step.setdefault(step, []).append(sum(valid) / len(valid))
    return [sum(v) / len(v) for _, v in sorted(by_step.items())]


def _values(page: Page, metric: str) -> dict[str, list]:
    chart = page.locator(f".chart[data-metric='{metric}']")
    expect(chart.locator("canvas").first).to_be_visible()
    return json.loads(chart.get_attribute("data-values"))


def _contrast(page: Page, selector: str) -> float:
    """WCAG contrast of an element's text colour on its background."""
    return page.evaluate(
        """(sel) => {
          const el = document.querySelector(sel), cs = getComputedStyle(el);
          const rgb = (s) => s.match(/\\d+(\\.\\d+)?/g).slice(0, 3).map(Number);
          const lum = (c) => { const [r, g, b] = c.map((v) => { v /= 255;
            return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
            return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
          const a = lum(rgb(cs.color)), b = lum(rgb(cs.backgroundColor));
          return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
        }""",
        selector,
    )


def test_run_page_leads_with_rollout_eval_and_trained_batch_reward(
    page: Page, fixture_server
) -> None:
    page.goto(fixture_server.url)
    expect(page.locator("h1")).to_have_text(RUN)
    expect(page.locator("#n-groups")).to_have_text(IDS["groups"])
    values = _values(page, "headline")
    rollout = values["rollout reward (all finished groups)"]
    want = _rollout_reward_from_the_trace()
    assert len(rollout) == len(want) and all(
        abs(a - b) < 1e-9 for a, b in zip(rollout, want, strict=True)
    )
    trained = [e["metrics"]["reward/mean"] for e in EVENTS if e["event"] == "BatchTrained"]
    assert values["trained-batch reward (reward/mean)"] == trained
    evals = {
        e["step"]: e["metrics"]["eval/mean_reward"]
        for e in EVENTS
        if "eval/mean_reward" in e.get("metrics", {})
    }
    assert values["held-out eval reward"] == [evals.get(s) for s in (1, 2, 3)]
    expect(page.locator("#card-reward b")).to_have_text(f"{want[0]:.3f} → {want[-1]:.3f}")
    expect(page.locator("#steps-table tr.step-row")).to_have_count(3)
    cells = page.locator("#steps-table td.rollout-reward")  # the table agrees with the curve
    expect(cells).to_have_text([f"{w:.3f}" for w in reversed(want)])
    # no two y-tick labels of a chart read the same, whatever the data's range
    page.wait_for_function("() => document.querySelectorAll('.chart[data-yticks]').length >= 4")
    for ticks in page.locator(".chart[data-yticks]").evaluate_all(
        "els => els.map(e => e.dataset.yticks)"
    ):
        labels = json.loads(ticks)
        assert len(labels) == len(set(labels)), labels
    assert _contrast(page, "#run-state") >= 4.5
    page.locator("#config summary").click()
    expect(page.locator("#config pre")).to_contain_text("tree_grpo")
    shot(page, "run")


def test_a_metric_chosen_in_the_picker_is_drawn(page: Page, fixture_server) -> None:
    page.goto(fixture_server.url)
    expect(page.locator(".chart[data-metric='dist:reward'] canvas")).to_have_count(1)
    page.locator("#metric-search").fill("ratio")
    recorded = {k for e in EVENTS for k in e.get("metrics", {}) if "ratio" in k}
    shown = page.locator("#metric-list label.metric:visible")
    expect(shown).to_have_text([" " + k for k in sorted(recorded)])
    page.locator("#metric-list label.metric[data-metric='pg/ratio_max'] input").check()
    values = _values(page, "pg/ratio_max")
    want = [e["metrics"]["pg/ratio_max"] for e in EVENTS if e["event"] == "BatchTrained"]
    assert values["pg/ratio_max"] == want
    expect(page).to_have_url(re.compile(r"m=pg%2Fratio_max"))
    page.locator("#ema").fill("0.5")
    expect(page).to_have_url(re.compile(r"ema=0\.5"))
    chart = page.locator(".chart[data-metric='pg/ratio_max']")
    smoothed, level = [], None
    for v in want:  # an EMA with weight 0.5 on the past
        level = v if level is None else 0.5 * level + 0.5 * v
        smoothed.append(level)
    drawn = json.loads(chart.get_attribute("data-drawn"))[0]
    assert all(abs(a - b) < 1e-12 for a, b in zip(drawn, smoothed, strict=True))
    page.goto(page.url)  # a shared link draws the same charts
    expect(page.locator(".chart[data-metric='pg/ratio_max'] canvas")).to_have_count(1)
    expect(page.locator("#ema-val")).to_have_text("0.50")
    shot(page, "picker")


def test_groups_list_is_one_row_per_group_with_filters_and_sort(page: Page, fixture_server) -> None:
    page.goto(f"{fixture_server.url}groups?run={RUN}")
    rows = page.locator("tr.group-row")
    expect(rows).to_have_count(len(GROUPS))
    dropped = next(g for g in GROUPS if len({t["reward"] for t in g["trajectories"]}) == 1)
    expect(page.locator(f"#group-{dropped['group_id']} .outcome")).to_have_text(
        "dropped: dropped_all_equal"
    )
    first = GROUPS[0]
    row = page.locator(f"#group-{first['group_id']}")
    expect(row.locator("td.q")).to_contain_text(first["task"]["question"])
    expect(row.locator("td.target")).to_have_text(first["task"]["answer"])
    expect(row.locator(".strip a")).to_have_count(len(first["trajectories"]))
    # a reward-0 sample is never painted green
    zero = page.locator(".strip a[data-reward='0.0']:not(.flag-infra_error)").first
    green = zero.evaluate(
        "e => { const [r, g, b] = getComputedStyle(e).backgroundColor.match(/\\d+/g).map(Number);"
        " return g - Math.max(r, b); }"
    )
    assert green < 20, green
    shot(page, "groups")

    page.locator("#f-toolerr").check()
    page.locator("#f-sort").select_option("-reward")
    page.locator("#f-apply").click()
    expect(page).to_have_url(re.compile(r"toolerr=1.*sort=-reward"))
    expect(rows).to_have_count(1)
    expect(page.locator(f"#group-{IDS['raised_group']} .flags")).to_contain_text("tool error")
    expect(page.locator(".strip a.match.flag-tool_error")).to_have_count(1)

    page.goto(f"{fixture_server.url}groups?run={RUN}&dropped=1")
    expect(rows).to_have_count(1)
    page.goto(f"{fixture_server.url}group?run={RUN}&id={dropped['group_id']}")
    expect(page.locator("#group-outcome")).to_have_text("not trained, dropped: dropped_all_equal")
    page.goto(f"{fixture_server.url}groups?run={RUN}")
    page.goto(f"{fixture_server.url}groups?run={RUN}&mixed=1&sort=-reward")
    means = [float(x) for x in rows.evaluate_all("els => els.map(e => e.dataset.mean)")]
    assert means == sorted(means, reverse=True) and len(means) == len(GROUPS) - 1
    page.goto(f"{fixture_server.url}groups?run={RUN}&status=infra_error")
    expect(rows).to_have_count(1)
    expect(page.locator(f"#group-{IDS['infra_group']}")).to_be_visible()
    page.goto(f"{fixture_server.url}groups?run={RUN}&sort=sideways")
    expect(page.locator("#error")).to_contain_text("sort must be one of step, -step")
    page.goto(f"{fixture_server.url}groups?run={RUN}&rmin=abc")
    expect(page.locator("#error")).to_contain_text("rmin must be a number (got 'abc')")
    page.guard.errors.clear()  # the 400s of bad filters are what this step asks for


def test_twenty_groups_fit_one_screen(browser, tmp_path: Path) -> None:
    """At 1280x900 the list shows 20 groups without scrolling (a run with 21: the fixture's
    trace three times over, under new ids)."""
    from agentrl.view import serve_in_thread

    run = tmp_path / "many"
    run.mkdir()
    with (run / "trajectories.jsonl").open("w") as f:
        for copy in range(3):
            for g in GROUPS:
                g = json.loads(json.dumps(g).replace(g["group_id"], f"{g['group_id']}c{copy}"))
                f.write(json.dumps(g) + "\n")
    server = serve_in_thread(run, 0, follow=False)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = context.new_page()
        page.goto(f"{server.url}groups?run=many")
        rows = page.locator("tr.group-row")
        expect(rows).to_have_count(21)
        bottom = rows.nth(19).evaluate("e => e.getBoundingClientRect().bottom")
        assert bottom <= 900, f"the 20th group ends at {bottom}px"
    finally:
        context.close()
        server.stop()


def test_a_raising_tool_is_flagged_with_the_success_rate(page: Page, fixture_server) -> None:
    page.goto(f"{fixture_server.url}traj?run={RUN}&id={IDS['raised_traj']}")
    failed = page.locator("tr.call[data-outcome='error']")
    expect(failed).to_have_count(1)
    expect(failed.locator(".call-error")).to_contain_text("KeyError")
    expect(page.locator("#traj-calls")).to_contain_text("1 failed")
    shot(page, "tool_error")
    page.goto(f"{fixture_server.url}group?run={RUN}&id={IDS['raised_group']}")
    expect(
        page.locator(f"a.sample[data-traj='{IDS['raised_traj']}'] .flag.tool-error")
    ).to_be_visible()
    # the success rate per step: calls that ran and succeeded over calls that ran
    finished = [e["step"] + 1 for e in EVENTS if e["event"] == "GroupFinished"]
    counts: dict[int, list[int]] = {}
    for step, g in zip(finished, GROUPS, strict=True):
        calls = [c for t in g["trajectories"] for c in _calls(t) if c["name"]]
        row = counts.setdefault(step, [0, 0])
        row[0] += sum(1 for c in calls if not c["error"])
        row[1] += len(calls)
    want = [ok / n for _, (ok, n) in sorted(counts.items())]
    assert want[0] < 1  # the raising call is in step 1
    page.goto(fixture_server.url)
    got = _values(page, "trace/tool_success_rate")["trace/tool_success_rate"]
    assert all(abs(a - b) < 1e-9 for a, b in zip(got, want, strict=True))


def test_trajectory_cut_at_the_limit_conversation_heatmap_and_raw_json(
    page: Page, fixture_server
) -> None:
    page.goto(f"{fixture_server.url}traj?run={RUN}&id={IDS['cut_traj']}")
    expect(page.locator("#traj-summary")).to_contain_text("cut at the token limit")
    expect(page.locator("#traj-summary .st")).to_have_text("truncated")
    page.goto(f"{fixture_server.url}traj?run={RUN}&id={IDS['parse_traj']}")
    expect(page.locator(".msg.prompt")).to_have_count(1)
    expect(page.locator(".msg.assistant").first).to_contain_text("turn 0")
    expect(page.locator("tr.parse-error")).to_contain_text("invalid JSON in tool call")
    tokens = page.locator("#heatmap .tok.model")
    assert tokens.count() > 0
    expect(tokens.first).to_have_attribute("title", re.compile(r"log-prob -?\d"))
    page.locator("#raw summary").click()
    expect(page.locator("#raw pre")).to_contain_text(f'"traj_id": "{IDS["parse_traj"]}"')


def test_heatmap_legend_is_fixed_and_its_range_matches_the_values(
    page: Page, fixture_server
) -> None:
    t = next(t for _, t in TRAJS if t["traj_id"] == IDS["branch_traj"])
    model = [s for s in t["segments"] if s["kind"] == "model"]
    entropies = [e for s in model for e in s["entropies"]]
    page.goto(f"{fixture_server.url}traj?run={RUN}&id={IDS['branch_traj']}&color=entropy")
    legend, seen = page.locator("#heat-legend"), page.locator("#heat-values")
    expect(legend).to_have_attribute("data-lo", "0.0")
    expect(legend).to_have_attribute("data-hi", "4.0")
    assert float(seen.get_attribute("data-min")) == min(entropies)
    assert float(seen.get_attribute("data-max")) == max(entropies)
    # the scale is fixed: an entropy of 1e-4 stays white, not full red
    lowest = page.locator("#heatmap .tok.model").nth(entropies.index(min(entropies)))
    if min(entropies) < 0.05:
        expect(lowest).to_have_attribute("style", re.compile(r"hsl\(5 85% 9[67]%\)"))
    shot(page, "heatmap")
    # staleness against the version that trained it: this run trained on-policy
    page.goto(f"{fixture_server.url}traj?run={RUN}&id={IDS['branch_traj']}&color=staleness")
    expect(page.locator("#heat-doc")).to_contain_text("the one that trained it")
    expect(page.locator("#heat-values")).to_have_attribute("data-max", "0.0")
    page.goto(f"{fixture_server.url}traj?run={RUN}&id={IDS['branch_traj']}&color=logprob")
    lps = [x for s in model for x in s["logprobs"]]
    assert float(page.locator("#heat-values").get_attribute("data-min")) == min(lps)


def test_infra_error_shows_its_message(page: Page, fixture_server) -> None:
    page.goto(f"{fixture_server.url}groups?run={RUN}&status=infra_error")
    page.locator(".strip a.match").click()
    expect(page.locator("#traj-error")).to_contain_text("search index unavailable")
    expect(page.locator("#traj-summary")).to_contain_text("infra_error")


def test_arpo_tree_opens_a_path(page: Page, fixture_server) -> None:
    group = next(g for g in GROUPS if g["group_id"] == IDS["tree_group"])
    page.goto(f"{fixture_server.url}group?run={RUN}&id={IDS['tree_group']}")
    expect(page.locator("svg#tree a.tree-node")).to_have_count(len(group["trajectories"]))
    branch = page.locator(f"svg#tree a.tree-node[data-traj='{IDS['branch_traj']}']")
    expect(branch.locator("text")).to_contain_text(re.compile(r"fork @turn 1 ΔH [+-]\d"))
    expect(branch.locator("text")).to_contain_text("A=")
    # the shared prompt is a stub: a branch's own tokens get the width it took before
    lengths = [sum(len(x["token_ids"]) for x in t["segments"]) for t in group["trajectories"]]
    me = next(t for t in group["trajectories"] if t["traj_id"] == IDS["branch_traj"])
    own = lengths[group["trajectories"].index(me)] - me["branch_position"]
    line = branch.locator("line")
    width = float(line.get_attribute("x2")) - float(line.get_attribute("x1"))
    assert width > 3 * 560 * own / max(lengths), (width, own)  # 560: the tree's width
    shot(page, "tree")
    branch.locator("text").click()
    expect(page).to_have_url(re.compile(r"/traj\?"))
    expect(page.locator("main")).to_contain_text("branch of")
    expect(page.locator("#traj-advantage")).to_contain_text("advantage (tree_grpo)")


def test_compare_shows_two_eval_points_per_held_out_task(page: Page, fixture_server) -> None:
    assert len({g["task_id"] for g in GROUPS}) == len(GROUPS)  # no training task repeats
    page.goto(fixture_server.url)
    page.locator("#nav-compare").click()
    tasks = page.locator("#eval-compare tr.eval-task")
    expect(tasks).to_have_count(2)
    for i in range(2):
        points = tasks.nth(i).locator("td.eval-point")
        expect(points).to_have_count(2)
        assert [points.nth(j).get_attribute("data-step") for j in range(2)] == ["2", "3"]
    expect(page.locator("#no-repeat")).to_be_visible()
    held_out = [json.loads(line) for line in (FIXTURE / "eval_trajectories.jsonl").open()]
    first = held_out[0]
    mean = sum(t["reward"] for t in first["trajectories"]) / len(first["trajectories"])
    row = page.locator(f"#eval-compare tr.eval-task[data-task='{first['task_id']}']")
    expect(row.locator(f"td.eval-point[data-step='{first['step']}']")).to_contain_text(
        f"{mean:.2f}"
    )
    shot(page, "compare")


def test_run_a_vs_run_b_overlays_curves_and_diffs_configs(page: Page, tmp_path: Path) -> None:
    from agentrl.view import serve_in_thread

    shutil.copytree(FIXTURE, tmp_path / "a")
    shutil.copytree(FIXTURE, tmp_path / "b")
    cfg = (tmp_path / "b" / "config.yaml").read_text()
    assert "  lr: 0.001\n" in cfg
    (tmp_path / "b" / "config.yaml").write_text(cfg.replace("  lr: 0.001\n", "  lr: 0.0005\n", 1))
    server = serve_in_thread(tmp_path, 0, follow=False)
    try:
        page.goto(f"{server.url}compare?run=a&other=b")
        expect(page.locator(".config-diff tbody tr")).to_have_count(1)
        expect(page.locator(".config-diff tbody tr")).to_contain_text("learner.lr")
        expect(page.locator("#runs-summary tbody tr")).to_have_count(2)
        page.locator("#overlay-link").click()
        values = _values(page, "headline")
        assert sorted(values) == sorted(
            f"{label} · {run}"
            for run in ("a", "b")
            for label in (
                "rollout reward (all finished groups)",
                "trained-batch reward (reward/mean)",
                "held-out eval reward",
            )
        )
        expect(page.locator("table.config-diff[data-other='b']")).to_contain_text("0.0005")
        page.goto(server.url)  # the runs list: its state pills are readable too
        assert _contrast(page, "#runs .state") >= 4.5
    finally:
        server.stop()


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
    # the route aborts the request: wait for that failure, so the handler has run
    with page.expect_event("requestfailed"):
        page.evaluate(
            "() => { console.error('boom'); fetch('http://example.com/x').catch(() => {}); }"
        )
    context.close()
    assert "boom" in guard.errors and guard.foreign == ["http://example.com/x"]


def test_a_run_trained_with_rloo_shows_rloos_advantages(page: Page, tmp_path) -> None:
    """A real run (the learner in its own process) records the advantages it trained with;
    the view shows those, labelled rloo: each equals r_i minus the mean of the others."""
    import os
    import subprocess
    import sys

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
    from agentrl.view import serve_in_thread

    old = tmp_path / RUN
    shutil.copytree(FIXTURE, old)
    (old / "advantages.jsonl").unlink()  # as a run wrote it before advantages were recorded
    (old / "eval_trajectories.jsonl").unlink()  # and before held-out groups were
    server = serve_in_thread(old, 0, follow=False)
    try:
        page.goto(f"{server.url}traj?run={RUN}&id={IDS['parse_traj']}")
        expect(page.locator("#traj-advantage")).to_contain_text("not recorded")
        page.goto(f"{server.url}group?run={RUN}&id={IDS['tree_group']}")
        expect(page.locator("a.sample dd.adv").first).to_have_text("not recorded")
        expect(page.locator("svg#tree a.tree-node text").first).not_to_contain_text("A=")
        page.goto(f"{server.url}compare?run={RUN}")
        expect(page.locator("#no-eval")).to_contain_text("orchestrator.eval_every")
    finally:
        server.stop()
