"""A short repo training run on the tiny model: tool calls in the sandboxed workspace,
the diffs they leave, rewards graded by the hidden tests, and learner steps on them."""

from __future__ import annotations

from pathlib import Path

import anyio

from agentrl.config import load_config
from agentrl.rollout.sinks import read_groups
from agentrl.run.orchestrator import Orchestrator
from agentrl.run.plotting import read_steps
from tests.orchestrator.test_train import BASE
from tests.sandbox.conftest import needs_bwrap

REPO_RUN = [
    # the tiny random model cannot call tools: its first two turns are scripted (view,
    # then an edit that fixes the bug or not by the parity of its first sampled token)
    "env.name=tests.envs.scripted_repo:ScriptedRepoEnv",
    "env.options.test_timeout_s=5",
    "rollout.max_turns=3",
    "rollout.max_tokens=1536",
    "sampler.max_new_tokens=4",
    "orchestrator.max_steps=2",
    "orchestrator.max_staleness=0",
]


@needs_bwrap
def test_repo_run_end_to_end(tmp_path: Path) -> None:
    cfg = load_config(overrides=[*BASE, *REPO_RUN])
    orch = Orchestrator(cfg, tmp_path / "run")
    orch.build()
    anyio.run(orch.run)
    assert [s["step"] for s in read_steps(tmp_path / "run")] == [1, 2]
    trajectories = [t for g in read_groups(tmp_path / "run") for t in g.trajectories]
    assert trajectories
    rewards = set()
    for t in trajectories:
        assert t.status in ("ok", "truncated"), t.error
        names = [c.name for turn in t.turns for c in turn.tool_calls]
        assert names[:2] == ["view", "edit"], names
        info = t.reward_info
        assert info["diff"].startswith("--- a/") and info["total"] == len(info["tests"])
        assert t.reward == (1.0 if info["passed"] == info["total"] else 0.0)
        rewards.add(t.reward)
    assert rewards == {0.0, 1.0}  # graded, not constant
