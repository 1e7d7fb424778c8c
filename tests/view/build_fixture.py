"""Builds tests/view/fixture_run: a real three-step ARPO training of the tiny model.

    python -m tests.view.build_fixture [OUT]

The run goes through the real orchestrator, rollout, trace and metrics writers, so the
viewer's tests read the format training writes today. Rebuild it when that format changes.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import anyio

from agentrl.config import load_config
from agentrl.run.orchestrator import Orchestrator
from tests.orchestrator.test_train import BASE

FIXTURE = Path(__file__).parent / "fixture_run"

ARPO = [
    "env.name=tests.view.fixture_env:ViewFixtureEnv",
    "env.options.fewshot=none",
    "env.options.call_format=tool_call",
    "sampler.max_new_tokens=6",
    "env.options.kinds=[capital,capital_to_currency]",
    "env.options.top_k=1",
    "rollout.max_turns=2",
    "rollout.max_tokens=256",
    "rollout.infra_retries=0",
    "rollout.branching.enabled=true",
    "rollout.branching.budget=4",
    "rollout.branching.initial=2",
    "rollout.branching.branches=1",
    "rollout.branching.entropy_window=2",
    "rollout.branching.mode=threshold",
    "rollout.branching.alpha=1.0",
    "rollout.branching.tau=0.5",
    "algorithm.advantage=tree_grpo",
    "algorithm.dynamic_sampling=true",
    "orchestrator.max_steps=3",
    "orchestrator.eval_every=2",
    "orchestrator.eval_tasks=2",
    "orchestrator.eval_samples=2",
    "orchestrator.max_staleness=0",
    "logging.tensorboard=false",
]


def build(out: Path = FIXTURE) -> Path:
    if out.exists():
        shutil.rmtree(out)
    cfg = load_config(overrides=[*BASE, *ARPO])
    orch = Orchestrator(cfg, out)
    orch.build()
    anyio.run(orch.run)
    shutil.rmtree(out / "checkpoints", ignore_errors=True)  # weights: not the viewer's business
    return out


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURE))
