"""ARPO branching in a real training run: search_qa on the real index, the tiny model,
branches that actually form after <result> blocks, Tree-GRPO advantages in the learner;
the rollout stops at </search>; a search service that is down is an infra error."""

from __future__ import annotations

from pathlib import Path

import anyio

from agentrl.config import load_config
from agentrl.envs import make_env
from agentrl.rollout import check_shared_prefixes
from agentrl.rollout.sinks import read_groups
from agentrl.run.orchestrator import Orchestrator
from agentrl.run.plotting import read_steps
from agentrl.run.settings import resolve
from tests.orchestrator.test_train import BASE

SEARCH = [
    # the tiny random model cannot write <search>: its first turn is scripted to search
    # for the question through the real tool; its second turn is its own (the answer)
    "env.name=tests.envs.scripted_search:ScriptedSearchQAEnv",
    "env.options.fewshot=none",
    "env.options.kinds=[capital,capital_to_currency]",  # the small country index
    "env.options.top_k=1",
    "rollout.max_turns=2",
    "rollout.max_tokens=256",
    "rollout.branching.enabled=true",
    "rollout.branching.budget=4",
    "rollout.branching.initial=2",
    "rollout.branching.branches=1",
    "rollout.branching.entropy_window=2",
    "rollout.branching.mode=threshold",  # alpha > tau: every tool result branches
    "rollout.branching.alpha=1.0",
    "rollout.branching.tau=0.5",
    "rollout.branching.attribution=hard",
    "algorithm.advantage=tree_grpo",
    "orchestrator.max_steps=2",
    "orchestrator.max_staleness=0",
]


def test_arpo_trains_on_search_with_branches(tmp_path: Path) -> None:
    cfg = load_config(overrides=[*BASE, *SEARCH])
    orch = Orchestrator(cfg, tmp_path / "run")
    orch.build()
    anyio.run(orch.run)
    assert orch.learner.version == 2
    assert [s["step"] for s in read_steps(tmp_path / "run")] == [1, 2]
    groups = read_groups(tmp_path / "run")
    assert groups and all(len(g.trajectories) == 4 for g in groups)
    branched = [t for g in groups for t in g.trajectories if t.parent_id is not None]
    assert branched, "no branch formed"
    assert sum(g.metadata["arpo"]["branched"] for g in groups) == len(branched)
    for g in groups:
        check_shared_prefixes(g)
        for t in g.trajectories:
            assert t.status in ("ok", "truncated"), t.error
            assert t.turns[0].tool_calls and t.turns[0].tool_calls[0].name == "search"
            assert "<result>" in t.segments[2].text  # the observation after the search


def test_search_tag_stops_the_turn_at_the_closing_tag() -> None:
    from agentrl.chat import ChatRenderer
    from agentrl.models import load_model
    from agentrl.rollout import RolloutEngine
    from agentrl.samplers import create_sampler

    model = load_model("tiny-llama")
    sampler = create_sampler("hf", model=model, max_batch_size=4, seed=0)
    try:
        cfg = load_config(overrides=BASE)
        for fmt, stop in [("search_tag", ("</search>",)), ("tool_call", ())]:
            env = make_env("search_qa", call_format=fmt)
            engine = RolloutEngine(env, sampler, ChatRenderer(model[1]), resolve(cfg).rollout)
            assert engine.runner.params.stop == stop
    finally:
        anyio.run(sampler.close)


def test_search_service_down_makes_the_episode_an_infra_error() -> None:
    import socket

    from agentrl.chat import ChatRenderer
    from agentrl.models import load_model
    from agentrl.rollout.episode import EpisodeLimits, run_episode
    from agentrl.samplers import SamplingParams, create_sampler
    from tests.envs.scripted_search import ScriptedSearchQAEnv

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/search"
    env = ScriptedSearchQAEnv(
        backend="http", search_url=url, search_retries=0, fewshot="none", kinds=["capital"]
    )
    model = load_model("tiny-llama")
    sampler = create_sampler("hf", model=model, max_batch_size=4, seed=0)
    renderer = ChatRenderer(model[1])
    params = SamplingParams(max_new_tokens=4, stop_token_ids=renderer.stop_token_ids)
    task = next(iter(env.tasks()))

    async def go():
        try:
            limits = EpisodeLimits(max_turns=2, max_tokens=256, infra_retries=1)
            return await run_episode(task, env, sampler, renderer, params, limits)
        finally:
            await sampler.close()

    traj = anyio.run(go)
    assert traj.status == "infra_error" and traj.metadata["attempts"] == 2
    assert "search service" in traj.error and url in traj.error  # not a wrong answer
