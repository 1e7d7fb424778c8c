"""Coding harnesses run unchanged as `env.name: agent` commands on a `repo` task.

Each test starts the real harness headless in bubblewrap, in the episode's fork of the
repository, against the gateway, with the command and settings of its
examples/harnesses/*.yaml. A scripted policy (real token ids of the tiny model's tokenizer)
makes the tool call that fixes the bug; the harness must run it in the workspace and send
its output back; the hidden tests grade the diff it leaves; the episode's samples must be
token-exact trajectories.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.harnesses.driver import (
    FIX,
    HARNESS_VENV,
    NODE_BIN,
    RAN,
    ToolCallPolicy,
    example_options,
    have,
    run_episode,
    tool_call,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


@pytest.fixture
def inner(tiny: tuple[Any, Any]) -> Any:
    from agentrl.samplers import create_sampler

    return create_sampler("hf", model=tiny, max_batch_size=4, seed=0)


def check_episode(policy: ToolCallPolicy, result: Any, trajs: list[Any]) -> Any:
    """What every harness must do; returns the main line's trajectory."""
    # the harness ran the policy's command in its workspace: the hidden tests pass
    assert result["reward"] == 1.0, result
    assert result["changed"] == ["listkit/ops.py"]
    # the command's output (computed by the shell) came back in a later request
    assert any(RAN in p for p in policy.prompts[1:])
    main = [t for t in trajs if t.metadata["gateway"]["main"]]
    assert len(main) >= 1
    last = main[-1]
    kinds = [s.kind for s in last.segments]
    assert kinds[-3:] == ["model", "observation", "model"] or "observation" in kinds
    # token-exact: the prefix check passed with exact tokens, and every model segment holds
    # exactly the ids the policy sampled for some call
    sampled = [gen.token_ids for _, gen in policy.calls]
    for t in trajs:
        assert t.metadata["exact_tokens"] is True
        for seg in t.segments:
            if seg.kind == "model":
                assert list(seg.token_ids) in [list(s) for s in sampled]
    obs = [s for t in main for s in t.segments if s.kind == "observation"]
    decoded = policy.tokenizer.decode([i for s in obs for i in s.token_ids])
    assert RAN in decoded  # the tool result is a masked observation of the main line
    return last


@pytest.mark.skipif(not have(HARNESS_VENV / "bin" / "mini"), reason="make setup-harnesses")
async def test_mini_swe_agent(inner: Any) -> None:
    call = "I will fix it.\n" + tool_call("bash", {"command": FIX})
    final = tool_call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})
    policy = ToolCallPolicy(inner, call, final)
    result, trajs, session = await run_episode(policy, example_options("mini_swe_agent"))
    main = check_episode(policy, result, trajs)
    # a plain tool loop: one sample, no prefix break
    assert len(trajs) == 1 and session.breaks == []
    assert [s.kind for s in main.segments] == ["prompt", "model", "observation", "model"]
    assert main.metadata["gateway"]["models"] == {"agentrl": 2}


def _opencode_policy(inner: Any) -> ToolCallPolicy:
    call = tool_call("bash", {"command": FIX, "description": "Fix the bug"})
    return ToolCallPolicy(
        inner,
        call,
        "The bug is fixed.",
        # its side calls: a title for the session, and the summary when it compacts
        is_main=lambda p: "title generator" not in p and "summarization agent" not in p,
        other=f"Fixed the chunk bug ({RAN})",
    )


def _roles(policy: ToolCallPolicy, trajs: list[Any]) -> dict[int, str]:
    """Sample number -> title / summary / main, read from the sample's prompt."""
    roles = {}
    for t in trajs:
        prompt = policy.tokenizer.decode(list(t.segments[0].token_ids))
        role = "title" if "title generator" in prompt else "main"
        roles[t.metadata["gateway"]["sample"]] = (
            "summary" if "summarization agent" in prompt else role
        )
    return roles


def _check_title(row: dict[str, Any], main: int) -> None:
    # the title call races the main loop's first call: a root when it comes first, else
    # a separate conversation under the main loop (then waiting on its tool call)
    assert (row["relation"], row["parent"]) in (("root", None), ("separate", main))
    assert not row["main"]


@pytest.mark.skipif(not have(NODE_BIN / "opencode"), reason="make setup-harnesses")
async def test_opencode(inner: Any) -> None:
    policy = _opencode_policy(inner)
    result, trajs, _ = await run_episode(policy, example_options("opencode"))
    main = check_episode(policy, result, trajs)
    # the main loop is one unbroken sample; the title call is an aside
    assert [s.kind for s in main.segments] == ["prompt", "model", "observation", "model"]
    tree = {r["sample"]: r for r in main.metadata["gateway"]["tree"]}
    roles = _roles(policy, trajs)
    assert sorted(roles.values()) == ["main", "title"]
    (m,) = [k for k, role in roles.items() if role == "main"]
    assert tree[m]["relation"] == "root" and tree[m]["main"]
    _check_title(tree[next(k for k in roles if k != m)], m)


@pytest.mark.skipif(not have(NODE_BIN / "opencode"), reason="make setup-harnesses")
@pytest.mark.parametrize("credit", ["all", "main"])
async def test_opencode_compaction_is_a_branch_of_the_session_tree(inner: Any, credit: str) -> None:
    """A context limit just above OpenCode's first prompt (~4.9k tokens with the example's
    three tools): after the first reply it compacts (a summarising conversation), then goes
    on from the summary."""
    options = example_options("opencode")
    config = json.loads(options["env"]["OPENCODE_CONFIG_CONTENT"])
    config["provider"]["agentrl"]["models"]["agentrl"]["limit"] = {"context": 4950, "output": 100}
    options["env"] = {**options["env"], "OPENCODE_CONFIG_CONTENT": json.dumps(config)}
    policy = _opencode_policy(inner)
    result, trajs, session = await run_episode(policy, options, subagent_credit=credit)
    assert result["reward"] == 1.0
    tree = {r["sample"]: r for r in trajs[0].metadata["gateway"]["tree"]}
    assert len(tree) == 4 and len(session.breaks) == 3
    if credit == "main":
        # only the main line is trained; the tree still names every sample
        assert len(trajs) == 2 and all(t.metadata["gateway"]["main"] for t in trajs)
        assert trajs[0].traj_id == "e0"
        return
    roles = _roles(policy, trajs)
    assert sorted(roles.values()) == ["main", "main", "summary", "title"]
    first, then = sorted(k for k, role in roles.items() if role == "main")
    (summary,) = [k for k, role in roles.items() if role == "summary"]
    (title,) = [k for k, role in roles.items() if role == "title"]
    # the main loop; its summary, made while its tool call was pending; the main loop
    # again from the summary, sharing the system prompt
    assert (tree[first]["relation"], tree[first]["parent"]) == ("root", None)
    assert (tree[summary]["relation"], tree[summary]["parent"]) == ("separate", first)
    assert (tree[then]["relation"], tree[then]["parent"]) == ("continues", first)
    assert tree[then]["shared_messages"] >= 1
    assert [k for k in tree if tree[k]["main"]] == [first, then]
    _check_title(tree[title], first)


@pytest.mark.skipif(not have(NODE_BIN / "claude"), reason="make setup-harnesses")
async def test_claude_code(inner: Any) -> None:
    call = tool_call("Bash", {"command": FIX, "description": "Fix the bug"})
    policy = ToolCallPolicy(inner, call, "The bug is fixed.")
    result, trajs, session = await run_episode(policy, example_options("claude_code"))
    main = check_episode(policy, result, trajs)
    # the Messages API tool loop never breaks its prefix
    assert len(trajs) == 1 and session.breaks == []
    assert [s.kind for s in main.segments] == ["prompt", "model", "observation", "model"]


SUBAGENT = "SUBAGENT: fix the off-by-one in chunk() in /repo/listkit/ops.py"


class SubagentPolicy(ToolCallPolicy):
    """The main agent hands the fix to a sub-agent (Claude Code's Agent tool); the
    sub-agent runs the command; both answer once its output is in their prompt."""

    def __init__(self, inner: Any) -> None:
        spawn = {"description": "Fix chunk", "prompt": SUBAGENT}
        spawn |= {"subagent_type": "general-purpose", "run_in_background": False}
        super().__init__(inner, tool_call("Agent", spawn), f"Done: {RAN}")
        self.fix = tool_call("Bash", {"command": FIX, "description": "Fix the bug"})

    def reply(self, prompt: str) -> str:
        if RAN in prompt:
            return self.final
        if SUBAGENT in prompt:
            return self.fix  # the sub-agent's conversation starts with the task we gave it
        return self.call


@pytest.mark.skipif(not have(NODE_BIN / "claude"), reason="make setup-harnesses")
async def test_claude_code_subagent_is_a_separate_sample_under_its_caller(inner: Any) -> None:
    policy = SubagentPolicy(inner)
    options = example_options("claude_code")
    # the example keeps Bash, Read and Edit (SmolLM2's 8192 tokens); the Agent tool too here
    command = list(options["command"])
    for flag in ("--tools", "--allowedTools"):
        command[command.index(flag) + 1] += ",Agent"
    result, trajs, _ = await run_episode(policy, {**options, "command": command})
    assert result["reward"] == 1.0, result
    tree = trajs[0].metadata["gateway"]["tree"]
    assert [r["relation"] for r in tree] == ["root", "separate"]
    main, sub = tree
    assert sub["parent"] == main["sample"]  # started while the main agent's call was pending
    assert main["main"] and not sub["main"]
    assert main["calls"] == 2 and sub["calls"] == 2
    # the sub-agent's Bash output came back to it, its answer back to the main agent
    for t in trajs:
        assert t.metadata["exact_tokens"] is True
        obs = [s for s in t.segments if s.kind == "observation"]
        assert RAN in policy.tokenizer.decode([i for s in obs for i in s.token_ids])


@pytest.mark.skipif(not have(NODE_BIN / "codex"), reason="make setup-harnesses")
async def test_codex(inner: Any) -> None:
    call = tool_call("exec_command", {"cmd": FIX})
    policy = ToolCallPolicy(inner, call, "The bug is fixed.")
    result, trajs, session = await run_episode(policy, example_options("codex"))
    main = check_episode(policy, result, trajs)
    # the Responses API tool loop (function_call / function_call_output) never breaks
    assert len(trajs) == 1 and session.breaks == []
    assert [s.kind for s in main.segments] == ["prompt", "model", "observation", "model"]
    assert main.metadata["gateway"]["models"] == {"agentrl": 2}
