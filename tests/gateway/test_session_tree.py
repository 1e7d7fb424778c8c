"""The session tree (agentrl.gateway.tree): how an episode's samples relate, the main line,
and gateway.subagent_credit, driven by the `openai` client as a harness drives it."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import openai
import pytest
from rich.console import Console

from agentrl.commands.rollout import show_trajectory
from agentrl.gateway.tree import format_tree
from agentrl.samplers import create_sampler
from agentrl.types import Trajectory, TrajectoryGroup
from tests.gateway.conftest import ScriptedSampler, start_gateway

pytestmark = pytest.mark.anyio

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'


def system(text: str) -> dict[str, str]:
    return {"role": "system", "content": text}


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


async def _turn(client: Any, messages: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    """One call; appends the reply and, for a tool call, its result to `messages`."""
    r = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS, **kw)
    message = r.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or []:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "a.py"})
    return r


async def _harness_episode(tiny: Any, credit: str) -> tuple[list[Trajectory], Any]:
    """A title aside, a main loop that starts a sub-agent, then compacts and goes on."""
    replies = ["Title", CALL, CALL, "sub done", CALL, "summary", "main done"]
    sampler = ScriptedSampler(create_sampler("hf", model=tiny, seed=0), replies)
    server = await start_gateway(sampler, subagent_credit=credit)
    gateway = server.gateway
    try:
        session = gateway.open_session()
        client = openai.AsyncOpenAI(
            base_url=gateway.session_url(session), api_key="k", max_retries=0
        )
        async with client:
            await _turn(client, [system("You title chats."), user("fix ls")])  # 0: aside
            main = [system("You are the main agent."), user("fix ls")]
            await _turn(client, main)  # 1: main, waits on its tool call
            sub = [system("You are a sub-agent."), user("look at a.py")]
            await _turn(client, sub)  # 2: started while main waits
            await _turn(client, sub)  # extends 2
            await _turn(client, main)  # extends 1: another tool call, pending
            summary = [system("Summarise."), user(json.dumps(main[1:]))]
            await _turn(client, summary)  # 3: the compaction's summary
            compacted = [main[0], user("Summary so far: ls was run.")]
            await _turn(client, compacted)  # 4: main goes on from the summary
        template = Trajectory(task_id="t", group_id="g", traj_id="e")
        closed = gateway.close_session(session.key)
        return closed.trajectories(template, credit=gateway.settings.subagent_credit), closed
    finally:
        await server.close()


async def test_samples_link_to_what_they_continue_or_were_started_from(tiny: Any) -> None:
    trajs, session = await _harness_episode(tiny, "all")
    assert len(trajs) == 5 and len(session.breaks) == 4
    tree = trajs[0].metadata["gateway"]["tree"]
    assert [(r["relation"], r["parent"]) for r in tree] == [
        ("root", None),  # the title: nothing was waiting on a tool call yet
        ("root", None),  # the main loop: shares no message with the title call
        ("separate", 1),  # the sub-agent, started while the main loop's call was pending
        ("separate", 1),  # the summary, made while the main loop's second call was pending
        ("continues", 1),  # the main loop after compaction: same system prompt
    ]
    assert tree[4]["shared_messages"] == 1 and tree[4]["shared_tokens"] > 0
    assert [r["main"] for r in tree] == [False, True, False, False, True]
    assert [r["calls"] for r in tree] == [1, 2, 2, 1, 1]
    for t in trajs:  # every trajectory carries its place in the tree
        g = t.metadata["gateway"]
        assert (g["relation"], g["parent"]) == (
            tree[g["sample"]]["relation"],
            tree[g["sample"]]["parent"],
        )
        assert g["credit"] == "all"
    lines = format_tree(tree)
    assert lines[1].startswith("sample 2: root") and lines[1].endswith("[main]")
    out = StringIO()  # agentrl inspect's trajectory header shows the tree
    show_trajectory(Console(file=out, width=160), TrajectoryGroup("t", trajs), trajs[4])
    assert "session tree" in out.getvalue() and "sample 5: continues" in out.getvalue()
    assert lines[2].startswith("  sample 3: separate")
    assert lines[4].startswith("  sample 5: continues (1 messages")


async def test_credit_main_trains_only_the_main_line(tiny: Any) -> None:
    trajs, _ = await _harness_episode(tiny, "main")
    assert [t.metadata["gateway"]["sample"] for t in trajs] == [1, 4]
    assert [t.traj_id for t in trajs] == ["e", "e.s4"]  # the first kept keeps the episode id
    assert all(t.metadata["gateway"]["main"] for t in trajs)
    assert len(trajs[0].metadata["gateway"]["tree"]) == 5  # the tree still names every sample
    lines = format_tree(trajs[0].metadata["gateway"]["tree"], "main")
    assert lines[0].endswith("[not trained]")


async def test_n_choices_are_children_of_their_sample(tiny: Any) -> None:
    sampler = ScriptedSampler(create_sampler("hf", model=tiny, seed=0), ["a", "b"])
    server = await start_gateway(sampler)
    try:
        session = server.gateway.open_session()
        client = openai.AsyncOpenAI(
            base_url=server.gateway.session_url(session), api_key="k", max_retries=0
        )
        async with client:
            await client.chat.completions.create(model="m", messages=[user("hi")], n=2)
        closed = server.gateway.close_session(session.key)
        trajs = closed.trajectories(Trajectory(task_id="t", group_id="g", traj_id="e"))
    finally:
        await server.close()
    tree = trajs[0].metadata["gateway"]["tree"]
    assert [(r["relation"], r["parent"]) for r in tree] == [("root", None), ("choice", 0)]
