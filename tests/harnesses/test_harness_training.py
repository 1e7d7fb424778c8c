"""Each harness trains the real SmolLM2-135M for 2 steps through `agentrl train`'s
machinery, with its examples/harnesses config as it is (CPU heavy: minutes per harness).

Prints one `harness-training` line per run (each sample's prompt tokens, samples, step times, peak
RSS, rewards): docs/gateway.md's table of these runs is made from them."""

from __future__ import annotations

import itertools
import json
import os
import resource
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentrl.run.events import BatchTrained, GroupFinished, RunStarted
from agentrl.run.orchestrator import Orchestrator
from agentrl.run.plotting import read_steps
from tests.harnesses.driver import HARNESS_VENV, NODE_BIN, REPO, have

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]

HARNESSES = {
    "mini_swe_agent": HARNESS_VENV / "bin" / "mini",
    "claude_code": NODE_BIN / "claude",
    "opencode": NODE_BIN / "opencode",
    "codex": NODE_BIN / "codex",
}
# in `make test-integration` by default (the shortest); the others with
# AGENTRL_HARNESS_TRAINING=all (docs/gateway.md gives each one's time)
DEFAULT = {"mini_swe_agent"}


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_two_training_steps_of_smollm2_through_a_harness(
    name: str, tmp_path: Path, monkeypatch: Any
) -> None:
    if not have(HARNESSES[name]):
        pytest.skip("make setup-harnesses")
    if name not in DEFAULT and os.environ.get("AGENTRL_HARNESS_TRAINING") != "all":
        pytest.skip("AGENTRL_HARNESS_TRAINING=all trains through every harness (12-29 min each)")
    from agentrl.config import load_config

    monkeypatch.chdir(REPO)  # the configs name the harnesses relative to the repo
    cfg = load_config(
        f"examples/harnesses/{name}.yaml",
        [
            "sampler.max_new_tokens=48",  # a harness that names max_tokens keeps its own
            "rollout.group_size=2",
            "rollout.infra_retries=0",
            "rollout.episode_timeout_s=1800",  # prompts of 4-7k tokens sampled on a CPU
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
    stamps: list[float] = []  # the run's own event times: each step's wall time, printed

    def on_event(e: Any) -> None:
        if isinstance(e, GroupFinished):
            groups.append(e.group)
        elif isinstance(e, RunStarted | BatchTrained):
            stamps.append(e.time)

    orch.events.subscribe(on_event)
    anyio.run(orch.run)
    steps = read_steps(tmp_path / "run")
    assert [s["step"] for s in steps] == [1, 2]
    trajs = [t for g in groups for t in g.trajectories]
    ok = [t for t in trajs if t.status != "infra_error"]
    assert ok, [t.error for t in trajs]
    for t in ok:
        assert t.num_model_tokens > 0 and t.metadata["gateway"]["calls"] >= 1
        assert "tests" in t.reward_info and "diff" in t.reward_info  # graded by hidden tests
    firsts = [t for t in ok if t.metadata["gateway"]["sample"] == 0]  # 0-based
    numbers = {
        "harness": name,
        # the prompt of each sample's first request (a harness's aside has its own sample)
        "prompt_tokens": sorted(t.prompt_length for t in ok),
        "samples_per_episode": [t.metadata["gateway"]["samples"] for t in firsts],
        "sample_tokens_max": max(t.num_tokens for t in ok),
        "step_wall_s": [round(b - a) for a, b in itertools.pairwise(stamps)],
        "learner_step_s": [round(s.get("time/step_s", 0.0), 1) for s in steps],
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "rewards": [t.reward for t in firsts],
    }
    print("harness-training", json.dumps(numbers))
