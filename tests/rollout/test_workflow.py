"""Workflows (`rollout.workflow`): a whole episode as one async def, trained end to end."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from agentrl.config import Config, RolloutConfig, SamplerConfig, load_config
from agentrl.errors import ConfigError, InfraError, PluginError
from agentrl.rollout import RolloutEngine
from agentrl.rollout.workflow import EpisodeContext, register_workflow
from agentrl.run.events import GroupFinished
from agentrl.run.orchestrator import Orchestrator
from agentrl.run.plotting import read_steps
from agentrl.run.settings import rollout_settings
from tests.rollout.scripted import ScriptedToolEnv

REPO = Path(__file__).resolve().parents[2]
TASKS = [{"id": f"t{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(4)]


def _engine(env, sampler, renderer, workflow: str, **rollout):
    cfg = RolloutConfig(**{"group_size": 2, "max_tokens": 300, **rollout}, workflow=workflow)
    return RolloutEngine(
        env,
        sampler,
        renderer,
        rollout_settings(Config(rollout=cfg, sampler=SamplerConfig(max_new_tokens=6))),
        tasks=TASKS,
    )


def test_the_example_workflow_trains_through_agentrl_train(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the config names the workflow file relative to the repo
    cfg = load_config(
        "examples/self_check.yaml",
        [
            "model.name=tiny-llama",
            "model.dtype=float32",
            "sampler.max_new_tokens=8",
            "rollout.group_size=2",
            "rollout.max_tokens=200",
            "algorithm.dynamic_sampling=false",  # the random model scores 0 everywhere
            "learner.micro_batch_size=4",
            "orchestrator.max_steps=2",
            "orchestrator.max_staleness=0",
            "orchestrator.learner_worker=thread",
            "logging.progress=false",
        ],
    )
    orch = Orchestrator(cfg, tmp_path / "run")
    orch.build()
    groups = []
    orch.events.subscribe(lambda e: groups.append(e.group) if isinstance(e, GroupFinished) else 0)
    anyio.run(orch.run)
    assert [s["step"] for s in read_steps(tmp_path / "run")] == [1, 2]
    assert orch.sampler.version == 2
    for t in (t for g in groups for t in g.trajectories):
        assert t.status == "ok"
        assert [s.kind for s in t.segments] == ["prompt", "model", "observation", "model"]
        model = [s for s in t.segments if s.kind == "model"]
        assert sum(t.loss_mask) == sum(len(s) for s in model)  # the follow-up is masked
        assert all(len(s.logprobs) == len(s) == len(s.versions) for s in model)
        assert "first_correct" in t.reward_info


@register_workflow("test_flaky", override=True)
async def flaky(ctx: EpisodeContext):
    flaky.calls += 1
    if flaky.calls % 2:
        raise InfraError("tool service down")
    chat = ctx.transcript([{"role": "user", "content": ctx.task["question"]}])
    await ctx.generate(chat)
    return ctx.finish(chat, reward=1.0)


flaky.calls = 0


@pytest.mark.anyio
async def test_infra_errors_in_a_workflow_are_retried_then_masked(sampler, renderer):
    flaky.calls = 0
    engine = _engine(ScriptedToolEnv(), sampler, renderer, "test_flaky", infra_retries=1)
    (group,) = await engine.collect(1)
    assert [t.status for t in group.trajectories] == ["ok", "ok"]
    assert all(t.metadata["attempts"] == 2 for t in group.trajectories)
    engine = _engine(ScriptedToolEnv(), sampler, renderer, "test_flaky", infra_retries=0)
    flaky.calls = 0
    (group,) = await engine.collect(1)
    assert sorted(t.status for t in group.trajectories) == ["infra_error", "ok"]


@register_workflow("test_returns_nothing", override=True)
async def returns_nothing(ctx: EpisodeContext):
    return None


@pytest.mark.anyio
async def test_a_workflow_that_returns_no_trajectory_is_a_clear_error(sampler, renderer):
    engine = _engine(ScriptedToolEnv(), sampler, renderer, "test_returns_nothing", group_size=1)
    with pytest.RaisesGroup(
        pytest.RaisesExc(TypeError, match="return ctx.finish"), flatten_subgroups=True
    ):
        await engine.collect(1)


def test_bad_workflow_settings_name_the_fix(sampler, renderer):
    with pytest.raises(PluginError, match="no attribute 'nope'"):
        _engine(ScriptedToolEnv(), sampler, renderer, "examples/self_check.py:nope")
    with pytest.raises(ConfigError, match=r"rollout\.workflow=episode"):
        _engine(
            ScriptedToolEnv(),
            sampler,
            renderer,
            "test_flaky",
            branching={"enabled": True, "budget": 4, "initial": 2},
        )
