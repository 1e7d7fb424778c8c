"""Token exactness and limits of the episode runner, on the tiny model and real renderer."""

from __future__ import annotations

import anyio
import pytest

from agentrl.config import Config, RolloutConfig, SamplerConfig
from agentrl.errors import TemplateMismatchError
from agentrl.rollout import EpisodeLimits, RolloutEngine, run_episode
from agentrl.run.settings import rollout_settings
from agentrl.samplers import SamplingParams
from agentrl.types import NO_VERSION, Batch

from .conftest import RecordingSampler
from .scripted import CheckingRenderer, ScriptedToolEnv

pytestmark = pytest.mark.anyio


def _engine(env, sampler, renderer, **rollout):
    cfg = RolloutConfig(**{"group_size": 4, "concurrency": 16, "max_tokens": 400, **rollout})
    return RolloutEngine(
        env,
        sampler,
        renderer,
        rollout_settings(Config(rollout=cfg, sampler=SamplerConfig(max_new_tokens=12))),
    )


async def test_token_exact_across_many_multiturn_episodes(sampler, renderer, tiny):
    rec = RecordingSampler(sampler)
    env = ScriptedToolEnv(tool_turns=3, calls_per_turn=2)
    engine = _engine(env, rec, renderer, max_turns=5)

    async def bump_version() -> None:  # a weight update while episodes are in flight
        await rec.wait_for_calls(8)  # of the 96 generations (24 episodes x 4 turns)
        state = {k: v.clone() for k, v in tiny[0].state_dict().items()}
        await sampler.update_weights(state, version=1)

    async with anyio.create_task_group() as tg:
        tg.start_soon(bump_version)
        groups = await engine.collect(6)

    by_request = {}
    for prompt, params, gen in rec.calls:
        by_request[(tuple(prompt), tuple(gen.token_ids))] = (params, gen)
    pairs = [(g.task, t) for g in groups for t in g.trajectories]
    assert len(pairs) == 24
    seen_versions = set()
    for task, t in pairs:
        assert t.status == "ok", t.error
        kinds = [s.kind for s in t.segments]
        assert kinds == ["prompt"] + ["model", "observation"] * 3 + ["model"]
        ids = t.input_ids
        pos = 0
        first = [
            {"role": "system", "content": "You are a calculator agent. Call tools."},
            {"role": "user", "content": task["question"]},
        ]
        assert t.segments[0].token_ids == renderer.prompt_ids(first)
        for seg in t.segments:
            if seg.kind == "model":
                # the sampler saw exactly the trajectory so far, and produced exactly this
                params, gen = by_request[(tuple(ids[:pos]), tuple(seg.token_ids))]
                assert seg.logprobs == gen.logprobs
                assert seg.versions == gen.versions
                assert params.max_new_tokens <= 400 - (pos - len(t.segments[0]))
            pos += len(seg)
        mask = t.loss_mask
        assert mask == [1 if k == "model" else 0 for s in t.segments for k in [s.kind] * len(s)]
        vers = t.versions
        assert all((v == NO_VERSION) == (m == 0) for v, m in zip(vers, mask, strict=True))
        model_vers = [v for v in vers if v != NO_VERSION]
        assert model_vers == sorted(model_vers)  # versions only go up along a trajectory
        seen_versions.update(model_vers)
        lps = t.behavior_logprobs
        assert all(lp == 0.0 for lp, m in zip(lps, mask, strict=True) if m == 0)
        assert all(lp < 0.0 for lp, m in zip(lps, mask, strict=True) if m == 1)
        assert t.metadata["exact_tokens"] in (True, False)  # the renderer's prefix proof ran
        # an independent prefix proof: rebuild the conversation from the trace alone
        messages = list(first)
        for turn, seg in zip(t.turns, [s for s in t.segments if s.kind == "model"], strict=True):
            messages.append({"role": "assistant", "content": renderer.decode(seg.token_ids)})
            messages += [
                {"role": "tool", "name": c.name, "content": c.result} for c in turn.tool_calls
            ]
        assert renderer.check_prefix(messages, t.segments, raise_on_mismatch=True).ok
        assert [len(turn.tool_calls) for turn in t.turns] == [2, 2, 2, 0]
        assert t.reward == float(len(t.segments[-1]) % 2)  # the env's final step reward
    assert seen_versions == {0, 1}
    batch = Batch.from_groups(groups)
    for i, t in enumerate(batch.trajectories):
        n = t.num_tokens
        assert batch.input_ids[i, :n].tolist() == t.input_ids
        assert batch.versions[i, :n].tolist() == t.versions


async def test_run_episode_limits(sampler, renderer):
    params = SamplingParams(max_new_tokens=10, stop_token_ids=renderer.stop_token_ids)
    many_tools = ScriptedToolEnv(tool_turns=50)
    task = {"id": "t0", "question": "Compute 1 + 1."}

    rec = RecordingSampler(sampler)
    t = await run_episode(task, many_tools, rec, renderer, params, EpisodeLimits(max_turns=3))
    assert t.status == "truncated" and t.metadata["truncation"] == "max_turns reached"
    assert len(t.turns) == 3
    # only the third turn is known to be the last: the sampler may drop its keys/values
    assert [p.last_turn for _, p, _ in rec.calls] == [False, False, True]

    wide = ScriptedToolEnv(tool_turns=50, calls_per_turn=3)
    t = await run_episode(task, wide, sampler, renderer, params, EpisodeLimits(max_tool_calls=4))
    assert t.status == "truncated" and t.metadata["truncation"] == "max_tool_calls exceeded"
    assert t.num_tool_calls == 6 and t.segments[-1].kind == "model"

    for budget in (5, 17, 60):
        t = await run_episode(
            task,
            many_tools,
            sampler,
            renderer,
            params,
            EpisodeLimits(max_turns=20, max_tokens=budget),
        )
        assert t.status == "truncated" and "token budget" in t.metadata["truncation"]
        assert t.response_length <= budget

    t = await run_episode(
        task, many_tools, sampler, renderer, params, EpisodeLimits(max_turns=20, context_length=80)
    )
    assert t.status == "truncated" and t.num_tokens <= 80


async def test_group_sizes_and_distinct_samples(sampler, renderer):
    env = ScriptedToolEnv(tool_turns=1)
    engine = _engine(env, sampler, renderer, group_size=5)
    (group,) = await engine.collect(1)
    assert len(group.trajectories) == 5
    assert len({t.traj_id for t in group.trajectories}) == 5
    assert len({tuple(t.segments[1].token_ids) for t in group.trajectories}) > 1
    assert ScriptedToolEnv.open_instances == set()


class _Unchecked:
    """Renders like the real renderer but has no prefix check."""

    def __init__(self, inner):
        self.inner = inner
        self.stop_token_ids = inner.stop_token_ids
        self.prompt_ids = inner.prompt_ids
        self.observation_ids = inner.observation_ids
        self.decode = inner.decode


async def test_a_renderer_without_a_prefix_check_is_rejected(sampler, renderer):
    env = ScriptedToolEnv(tool_turns=1)
    with pytest.raises(TypeError, match=r"_Unchecked is not a Renderer: it lacks check_prefix"):
        _engine(env, sampler, _Unchecked(renderer))
    skipping = _Unchecked(renderer)
    skipping.check_prefix = None  # present but not callable: still no check
    with pytest.raises(TypeError, match="lacks check_prefix"):
        await run_episode({"id": "t"}, env, sampler, skipping, SamplingParams())
    bare = object()
    with pytest.raises(TypeError, match="lacks stop_token_ids, prompt_ids, observation_ids"):
        _engine(env, sampler, bare)


async def test_the_prefix_is_checked_after_every_observation(sampler, renderer):
    checking = CheckingRenderer(renderer)
    params = SamplingParams(max_new_tokens=8, stop_token_ids=renderer.stop_token_ids)
    task = {"id": "t0", "question": "Compute 1 + 1."}
    t = await run_episode(task, ScriptedToolEnv(tool_turns=2), sampler, checking, params)
    assert [s.kind for s in t.segments] == ["prompt"] + ["model", "observation"] * 2 + ["model"]
    assert checking.checked == [3, 5, 6]  # after each observation, then the whole episode
    assert t.metadata["exact_tokens"] in (True, False)


async def test_a_mismatch_stops_the_episode_before_the_next_turn(sampler, renderer):
    rec = RecordingSampler(sampler)
    params = SamplingParams(max_new_tokens=8, stop_token_ids=renderer.stop_token_ids)
    task = {"id": "t0", "question": "Compute 1 + 1."}
    env = ScriptedToolEnv(tool_turns=3)
    failing = CheckingRenderer(renderer, fail_at_segments=3)  # the first observation
    with pytest.raises(TemplateMismatchError, match="scripted mismatch at 3"):
        await run_episode(task, env, rec, failing, params)
    assert len(rec.calls) == 1  # no second turn was sampled on a drifted prefix

    limits = EpisodeLimits(on_template_mismatch="resample", infra_retries=1)
    t = await run_episode(task, env, rec, failing, params, limits)
    assert t.status == "infra_error" and t.metadata["attempts"] == 2
    assert all("scripted mismatch" in e for e in t.metadata["retried_errors"])
