"""Each harness trains the real SmolLM2-135M for 2 steps through `agentrl train`'s
machinery, with its examples/harnesses config (CPU heavy: minutes per harness)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentrl.run.events import GroupFinished
from agentrl.run.orchestrator import Orchestrator
from agentrl.run.plotting import read_steps
from tests.harnesses.driver import HARNESS_VENV, NODE_BIN, REPO, have

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]

HARNESSES = {
    "mini_swe_agent": HARNESS_VENV / "bin" / "mini",
    "opencode": NODE_BIN / "opencode",
    "codex": NODE_BIN / "codex",
    # claude_code is left out: its first prompt (~20.6k tokens) is over SmolLM2's 8192
}


def _memory_gb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_two_training_steps_of_smollm2_through_a_harness(
    name: str, tmp_path: Path, monkeypatch: Any
) -> None:
    if not have(HARNESSES[name]):
        pytest.skip("make setup-harnesses")
    if name != "mini_swe_agent" and os.environ.get("AGENTRL_HARNESS_TRAINING") != "all":
        # Codex's two steps took 17 min here (6-8k-token prompts sampled on a CPU): on
        # request only, so the integration tier stays within CI's time; mini-swe-agent's runs
        pytest.skip("AGENTRL_HARNESS_TRAINING=all trains through every harness (~20+ min)")
    if name == "opencode" and _memory_gb() < 32:
        # its 8.2k-token samples: the learner's eager log-probs reached 16 GB RSS in step 2
        # and the kernel's OOM killer ended the run on a 23 GB machine
        pytest.skip("OpenCode's 8k-token samples need more than 32 GB of memory to train")
    from agentrl.config import load_config

    monkeypatch.chdir(REPO)  # the configs name the harnesses relative to the repo
    cfg = load_config(
        f"examples/harnesses/{name}.yaml",
        [
            "sampler.max_new_tokens=48",
            "rollout.group_size=2",
            "rollout.infra_retries=0",
            "rollout.episode_timeout_s=1800",  # prompts of 6-8k tokens sampled on a CPU
            "algorithm.dynamic_sampling=false",  # SmolLM2 as it is fixes nothing: all 0
            "learner.batch_groups=1",
            "learner.micro_batch_size=1",
            "learner.fused_logprobs=off",
            "orchestrator.max_steps=2",
            "orchestrator.max_staleness=0",
            "orchestrator.learner_worker=thread",
            "orchestrator.checkpoint_every=0",
            "logging.progress=false",
        ],
    )
    orch = Orchestrator(cfg, tmp_path / "run")
    orch.build()
    groups: list[Any] = []
    orch.events.subscribe(lambda e: groups.append(e.group) if isinstance(e, GroupFinished) else 0)
    anyio.run(orch.run)
    assert [s["step"] for s in read_steps(tmp_path / "run")] == [1, 2]
    trajs = [t for g in groups for t in g.trajectories]
    ok = [t for t in trajs if t.status != "infra_error"]
    assert ok, [t.error for t in trajs]
    for t in ok:
        assert t.num_model_tokens > 0 and t.metadata["gateway"]["calls"] >= 1
        assert "tests" in t.reward_info and "diff" in t.reward_info  # graded by hidden tests
