"""`env.name: agent` on a `repo` task: a command in the episode's fork of the repository
(bubblewrap, /repo), graded by the hidden tests; the options that make it so."""

from __future__ import annotations

import shutil
import sys
from typing import Any

import pytest

from agentrl.errors import ConfigError
from tests.harnesses.driver import FIX, RAN, REPO, ToolCallPolicy, repo_task, run_episode, tool_call

pytestmark = pytest.mark.anyio
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

PLAIN = {
    "task_env": {"name": "repo"},
    "sandbox": "bwrap",
    "cwd": str(REPO),
    "command": [sys.executable, str(REPO / "tests" / "harnesses" / "plain_agent.py"), "{prompt}"],
    "env": {"PYTHONPATH": str(REPO)},
}


def _policy(tiny: Any, call: str) -> ToolCallPolicy:
    from agentrl.samplers import create_sampler

    return ToolCallPolicy(create_sampler("hf", model=tiny, seed=0), call, "done")


@needs_bwrap
async def test_a_command_fixes_its_fork_and_the_hidden_tests_grade_it(tiny: Any) -> None:
    policy = _policy(tiny, tool_call("bash", {"command": FIX}))
    result, trajs, session = await run_episode(policy, PLAIN)
    assert result["reward"] == 1.0 and result["changed"] == ["listkit/ops.py"]
    assert "range(0, len(xs), size)" in result["diff"]
    assert result["agent_output"].strip() == "done"
    first = policy.prompts[0]
    # the program ran in /repo, got the issue text through {prompt} and nothing on stdin
    assert "cwd=/repo stdin=0" in first
    assert repo_task()["prompt"] in first and "Files in /repo:" in first
    assert RAN in policy.prompts[1]
    assert len(trajs) == 1 and session.breaks == [] and trajs[0].metadata["exact_tokens"]


@needs_bwrap
async def test_each_episode_has_its_own_fork_and_leaves_the_task_intact(tiny: Any) -> None:
    # the first episode breaks the code; the second starts from the task's own files
    policy = _policy(tiny, tool_call("bash", {"command": "echo broken > listkit/ops.py"}))
    result, _, _ = await run_episode(policy, PLAIN)
    assert result["reward"] == 0.0 and result["changed"] == ["listkit/ops.py"]
    look = "grep -c 'range(1, len' listkit/ops.py && echo AGENTRL_RAN_$((6*7))"
    policy = _policy(tiny, tool_call("bash", {"command": look}))
    result, trajs, _ = await run_episode(policy, PLAIN)
    assert result["changed"] == [] and result["reward"] == 0.0
    obs = [i for s in trajs[0].segments if s.kind == "observation" for i in s.token_ids]
    assert f"1\n{RAN}" in policy.tokenizer.decode(obs)


@needs_bwrap
@pytest.mark.parametrize("crash", ["before", "after"])
def test_a_harness_that_fails_after_it_ran_is_graded_not_masked(crash: str) -> None:
    """A harness that quits on the model's reply (Codex on a reply cut at max_tokens) is the
    policy's failure: graded, with agent_error. One that never made a call is infra."""
    import anyio

    from agentrl.config import config_from_dict
    from agentrl.run.runtime import assemble

    options = {**PLAIN, "command": [*PLAIN["command"], crash]}
    options.pop("cwd")
    cfg = config_from_dict(
        {
            "model": {"name": "tiny-llama", "dtype": "float32"},
            "sampler": {"max_new_tokens": 4},
            "env": {"name": "agent", "options": {**options, "cwd": str(REPO)}},
            "rollout": {"group_size": 1, "infra_retries": 0},
            "logging": {"progress": False},
        }
    )

    async def main() -> list[Any]:
        run = await anyio.to_thread.run_sync(lambda: assemble(cfg, "rollout"))
        async with run:
            return await run.engine.collect(1)

    (traj,) = [t for g in anyio.run(main) for t in g.trajectories]
    if crash == "before":
        assert traj.status == "infra_error" and "could not start" in traj.error
    else:
        assert traj.status == "ok" and traj.reward == 0.0
        assert "quit on the model's reply" in traj.reward_info["agent_error"]
        assert traj.reward_info["changed"] == [] and len(traj.reward_info["tests"]) == 4


def test_repo_tasks_need_a_command_in_bubblewrap() -> None:
    from agentrl.envs import make_env

    with pytest.raises(ConfigError, match="sandbox: bwrap"):
        make_env("agent", **{**PLAIN, "sandbox": "process"})
    with pytest.raises(ConfigError, match=r"give env\.options\.command"):
        make_env("agent", task_env={"name": "repo"}, entrypoint="tests.gateway.agents:two_turns")
    with pytest.raises(ConfigError, match="leave verifier unset"):
        make_env("agent", **{**PLAIN, "verifier": "math"})


def test_placeholders_fill_argv_and_env() -> None:
    from agentrl.envs.agent_programs import Workspace, _fill

    values = {"base_url": "http://h/s/k/v1", "api_key": "k", "model": "agentrl"}
    ws = Workspace(host_path="/tmp/x", path="/repo", prompt="fix it")
    values |= {"prompt": ws.prompt, "workspace": ws.path}
    assert _fill('base_url="{base_url}"', values) == 'base_url="http://h/s/k/v1"'
    assert _fill("{prompt} in {workspace}", values) == "fix it in /repo"
    assert _fill("{python}", values) == sys.executable
    assert _fill("{other} {", values) == "{other} {"  # not ours: left as written
