"""The session tree of an agent episode on the viewer's trajectory page, in a real browser:
episodes recorded by the real gateway (the `openai` client driving a title aside, a main
loop that starts a sub-agent, then compacts), under gateway.subagent_credit all and main."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import pytest
from playwright.sync_api import Page, expect

from agentrl.types import TrajectoryGroup
from tests.view.conftest import FIXTURE, shot

RUN = "agent_run"


def _episodes() -> dict[str, list[Any]]:
    from agentrl.models import load_model
    from tests.gateway.test_session_tree import _harness_episode

    tiny = load_model("tiny-llama", dtype="float32")
    out = {}
    for credit in ("all", "main"):
        trajs, _ = anyio.run(_harness_episode, tiny, credit, backend="asyncio")
        for t in trajs:  # one group per credit setting: distinct ids
            t.group_id, t.traj_id = credit, t.traj_id.replace("e", f"ep-{credit}", 1)
        out[credit] = trajs
    return out


@pytest.fixture(scope="module")
def agent_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from agentrl.view import serve_in_thread

    # the browser's sync API holds an event loop on this thread: the gateway runs on another
    with ThreadPoolExecutor(1) as pool:
        episodes = pool.submit(_episodes).result()
    root = tmp_path_factory.mktemp("view")
    (root / RUN).mkdir()
    with (root / RUN / "trajectories.jsonl").open("w") as f:
        for credit, trajs in episodes.items():
            f.write(json.dumps(TrajectoryGroup("t", trajs, group_id=credit).to_dict()) + "\n")
    server = serve_in_thread(root, 0, follow=False)
    server.episodes = episodes
    yield server
    server.stop()


def _rows(page: Page) -> Any:
    return page.locator("#session-tree li.session-node")


def test_the_tree_shows_where_each_sample_came_from(page: Page, agent_server: Any) -> None:
    trajs = agent_server.episodes["all"]
    sub = next(t for t in trajs if t.metadata["gateway"]["sample"] == 2)  # the sub-agent
    page.goto(f"{agent_server.url}traj?run={RUN}&id={sub.traj_id}")
    rows = _rows(page)
    expect(rows).to_have_count(5)
    # depth first: the title aside; the main loop with its sub-agent, its summary and its
    # continuation after the compaction under it
    samples = [int(x) for x in rows.evaluate_all("rs => rs.map(r => r.dataset.sample)")]
    depths = [int(x) for x in rows.evaluate_all("rs => rs.map(r => r.dataset.depth)")]
    relations = rows.evaluate_all("rs => rs.map(r => r.dataset.relation)")
    assert samples == [1, 2, 3, 4, 5]
    assert depths == [0, 0, 1, 1, 1]
    assert relations == ["root", "root", "separate", "separate", "continues"]
    expect(rows.nth(4)).to_contain_text(re.compile(r"continues \(1 messages, \d+ tokens shared\)"))
    # the main line: the main loop and its continuation; the page's own sample is marked
    expect(page.locator("#session-tree li.main")).to_have_count(2)
    expect(rows.nth(1).locator(".session-main")).to_be_visible()
    expect(page.locator("#session-tree li.current")).to_have_attribute("data-sample", "3")
    # credit all: every sample got the reward
    expect(page.locator("#session-tree li.uncredited")).to_have_count(0)
    expect(page.locator("main")).to_contain_text("gateway.subagent_credit: all")
    shot(page, "session_tree")
    # each other sample links to its trajectory: the sub-agent's parent is one click away
    rows.nth(1).locator("a").click()
    main = next(t for t in trajs if t.metadata["gateway"]["sample"] == 1)
    expect(page).to_have_url(re.compile(rf"id={re.escape(main.traj_id)}$"))
    expect(page.locator("#session-tree li.current")).to_have_attribute("data-sample", "2")


def test_credit_main_marks_the_samples_that_were_not_trained(page: Page, agent_server: Any) -> None:
    trajs = agent_server.episodes["main"]
    assert [t.metadata["gateway"]["sample"] for t in trajs] == [1, 4]
    page.goto(f"{agent_server.url}traj?run={RUN}&id={trajs[1].traj_id}")
    rows = _rows(page)
    expect(rows).to_have_count(5)
    expect(page.locator("main")).to_contain_text("gateway.subagent_credit: main")
    uncredited = page.locator("#session-tree li.uncredited")
    expect(uncredited).to_have_count(3)
    for row in uncredited.all():
        expect(row).to_contain_text("not trained")
        expect(row.locator("a")).to_have_count(0)  # no trajectory of its own in the group
    # the main line's samples are the group's two trajectories, linked to each other
    credited = page.locator("#session-tree li.session-node:not(.uncredited)")
    expect(credited).to_have_count(2)
    expect(credited.nth(0).locator("a")).to_have_attribute(
        "href", re.compile(rf"id={re.escape(trajs[0].traj_id)}$")
    )


def test_a_single_sample_episode_has_no_tree(page: Page, fixture_server: Any) -> None:
    groups = [json.loads(line) for line in (FIXTURE / "trajectories.jsonl").open()]
    tid = groups[0]["trajectories"][0]["traj_id"]
    page.goto(f"{fixture_server.url}traj?run=fixture_run&id={tid}")
    expect(page.locator("h1")).to_contain_text(tid)
    expect(page.locator("#session-tree")).to_have_count(0)
