"""What in-flight rows of the hf sampler do on a weight update (``on_update``): with
``reprefill`` every token sampled after the swap is exactly what the new weights give for
its context; with ``keep`` it is not (the context's KV is the old weights')."""

from __future__ import annotations

import anyio
import pytest
import torch

from agentrl.errors import ConfigError, SamplerError
from agentrl.models import load_model
from agentrl.run.settings import resolve
from agentrl.samplers import SamplingParams, on_update_policy, sampler_options
from agentrl.samplers.hf import HFSampler
from agentrl.types import Trajectory, Turn
from tests.samplers.test_hf import perturbed, teacher_forced, wait_for
from tests.test_runtime import _cfg, _openai_cfg

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _prompts(tokenizer) -> list[list[int]]:
    shared = tokenizer("a prompt two rows share, long enough to fill a block or two " * 2)
    return [
        list(shared["input_ids"]),
        list(shared["input_ids"]),
        list(tokenizer("short")["input_ids"]),
        list(tokenizer("a middle length prompt about tools and code")["input_ids"]),
    ]


async def _generate_across_update(on_update: str, prefill_tokens: int = 4096):
    """Four rows (two sharing a prompt) sampling 100 tokens; new weights (version 1) after
    every row has sampled a few. Returns the sampler's model (now at version 1), the
    prompts and the generations."""
    torch.set_num_threads(1)
    model, tokenizer = load_model("tiny-llama", dtype="float32")
    sampler = HFSampler(
        model,
        tokenizer,
        on_update=on_update,
        prefill_tokens=prefill_tokens,
        default_stop_token_ids=(),
        seed=0,
    )
    prompts = _prompts(tokenizer)
    gens: dict[int, object] = {}

    async def one(i: int) -> None:
        params = SamplingParams(temperature=1.0, max_new_tokens=100, seed=i)
        gens[i] = await sampler.generate(prompts[i], params)

    async with anyio.create_task_group() as tg:
        for i in range(len(prompts)):
            tg.start_soon(one, i)
        await wait_for(lambda: sampler.stats()["steps"] >= 4)
        await sampler.update_weights(perturbed(model, scale=0.05), 1)
    stats = sampler.stats()
    await sampler.close()
    return model, prompts, [gens[i] for i in range(len(prompts))], stats


def _gap_after_update(model, prompt, gen) -> float:
    """Largest |sampler log-prob - fresh forward under the new weights| over the tokens
    sampled after the update."""
    expected, _ = teacher_forced(model, prompt, gen.token_ids, 1.0)
    new = torch.tensor([v == 1 for v in gen.versions])
    return (torch.tensor(gen.logprobs)[new] - expected[new]).abs().max().item()


@pytest.mark.parametrize("prefill_tokens", [4096, 64])  # 64: several re-prefill chunks
async def test_reprefill_samples_exactly_from_the_new_weights(prefill_tokens):
    model, prompts, gens, stats = await _generate_across_update("reprefill", prefill_tokens)
    for prompt, gen in zip(prompts, gens, strict=True):
        n_old = gen.versions.count(0)
        assert 0 < n_old < 100 and gen.versions == [0] * n_old + [1] * (100 - n_old)
        assert _gap_after_update(model, prompt, gen) < 1e-4
        # the context cached when the update came: the prompt and every token but the
        # pending one (sampled by the old weights, fed after the swap)
        assert gen.metadata["on_update"] == "reprefill"
        assert gen.metadata["reprefilled_tokens"] == len(prompt) + n_old - 1
    assert stats["reprefills"] == 1
    # the shared prompt was forwarded once, its rows reuse it from the prefix cache
    contexts = sum(g.metadata["reprefilled_tokens"] for g in gens)
    assert 0 < stats["reprefill_tokens"] < contexts


async def test_keep_samples_after_an_update_from_the_old_keys_and_values():
    model, prompts, gens, stats = await _generate_across_update("keep")
    gaps = [_gap_after_update(model, p, g) for p, g in zip(prompts, gens, strict=True)]
    assert min(gaps) > 1e-3  # the same check reprefill passes at 1e-4 fails here
    assert all(
        g.metadata == {**g.metadata, "on_update": "keep", "reprefilled_tokens": 0} for g in gens
    )
    assert stats["reprefills"] == 0 and stats["reprefill_tokens"] == 0


async def test_a_turn_records_the_policy_and_survives_json():
    turn = Turn(index=0, generated_tokens=5, on_update="reprefill", reprefilled_tokens=42)
    back = Trajectory.from_json(Trajectory(turns=[turn]).to_json()).turns[0]
    assert (back.on_update, back.reprefilled_tokens) == ("reprefill", 42)
    old = Turn.from_dict({"index": 0})  # a trace written before these fields existed
    assert (old.on_update, old.reprefilled_tokens) == (None, None)


async def test_a_failing_reprefill_fails_its_rows_and_the_sampler_serves_on():
    """A re-prefill forward that raises (out of memory, a broken kernel): the rows in
    flight get a SamplerError naming the re-prefill, nothing hangs, and the sampler goes
    on serving new requests under the new weights."""
    torch.set_num_threads(1)
    model, tokenizer = load_model("tiny-llama", dtype="float32")
    sampler = HFSampler(model, tokenizer, on_update="reprefill", default_stop_token_ids=(), seed=0)
    forward, reprefill = sampler._forward, sampler._reprefill
    in_reprefill = False

    def failing_reprefill() -> None:
        nonlocal in_reprefill
        in_reprefill = True
        try:
            reprefill()
        finally:
            in_reprefill = False

    def forward_or_fail(chunk):
        if in_reprefill:  # fault injection: the re-prefill's forward pass raises
            raise RuntimeError("out of memory (injected)")
        return forward(chunk)

    sampler._forward, sampler._reprefill = forward_or_fail, failing_reprefill
    prompts = _prompts(tokenizer)
    errors: dict[int, BaseException] = {}

    async def one(i: int) -> None:
        params = SamplingParams(temperature=1.0, max_new_tokens=100, seed=i)
        try:
            await sampler.generate(prompts[i], params)
        except Exception as e:
            errors[i] = e

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
            await wait_for(lambda: sampler.stats()["steps"] >= 4)
            await sampler.update_weights(perturbed(model, scale=0.05), 1)
        assert sorted(errors) == list(range(len(prompts)))
        for e in errors.values():
            assert isinstance(e, SamplerError), repr(e)
            assert "re-prefill failed: RuntimeError: out of memory (injected)" in str(e)
        assert sampler.stats()["reprefills"] == 1
        after = await sampler.generate(
            prompts[2], SamplingParams(temperature=1.0, max_new_tokens=8)
        )
    await sampler.close()
    assert len(after.token_ids) == 8 and after.versions == [1] * 8


def test_hf_sampler_refuses_an_unknown_on_update():
    model, tokenizer = load_model("tiny-llama", dtype="float32")
    with pytest.raises(ValueError, match="on_update must be one of keep, reprefill, drain"):
        HFSampler(model, tokenizer, on_update="restart")


# --- the config key ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "policy"),
    [
        ((), "keep"),
        (("sampler.on_update=reprefill",), "reprefill"),
        (("sampler.on_update=drain",), "drain"),
    ],
)
def test_on_update_reaches_the_hf_sampler(overrides, policy):
    assert sampler_options(resolve(_cfg(*overrides)).sampler)["on_update"] == policy


@pytest.mark.parametrize(
    ("override", "replacement"),
    [
        ("sampler.drain_on_update=true", "sampler.on_update: drain"),
        ("orchestrator.partial_rollouts=false", "sampler.on_update: drain"),
    ],
)
def test_the_removed_drain_keys_name_their_replacement(override, replacement):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key} was removed: use {replacement}"):
        _cfg(override)


def test_vllm_reprefills_and_refuses_keep():
    assert on_update_policy(resolve(_cfg("sampler.backend=vllm")).sampler) == "reprefill"
    opts = sampler_options(resolve(_cfg("sampler.backend=vllm", "sampler.on_update=drain")).sampler)
    assert opts["on_update"] == "drain"
    with pytest.raises(
        ConfigError, match=r"sampler.on_update=keep cannot be honoured by sampler.backend=vllm"
    ):
        sampler_options(resolve(_cfg("sampler.backend=vllm", "sampler.on_update=keep")).sampler)


@pytest.mark.parametrize("policy", ["keep", "reprefill"])
def test_openai_only_drains(policy):
    assert on_update_policy(resolve(_openai_cfg()).sampler) == "drain"
    with pytest.raises(
        ConfigError,
        match=f"sampler.on_update={policy} cannot be honoured by sampler.backend=openai",
    ):
        sampler_options(resolve(_openai_cfg(f"sampler.on_update={policy}")).sampler)


def test_on_update_may_not_hide_in_backend_options():
    with pytest.raises(ConfigError, match=r"sampler.options.on_update repeats.*sampler.on_update"):
        sampler_options(resolve(_cfg("sampler.options={on_update: keep}")).sampler)


async def test_episodes_record_the_reprefill_on_the_turns_it_interrupted():
    from agentrl.chat import ChatRenderer
    from agentrl.config import Config, RolloutConfig, SamplerConfig
    from agentrl.rollout import RolloutEngine
    from agentrl.run.settings import rollout_settings
    from tests.rollout.scripted import ScriptedToolEnv

    torch.set_num_threads(1)
    model, tokenizer = load_model("tiny-llama", dtype="float32")
    sampler = HFSampler(model, tokenizer, on_update="reprefill", seed=0)
    engine = RolloutEngine(
        ScriptedToolEnv(tool_turns=2),
        sampler,
        ChatRenderer(tokenizer, tools=[]),
        rollout_settings(
            Config(
                rollout=RolloutConfig(group_size=4, concurrency=8, max_turns=3, max_tokens=400),
                sampler=SamplerConfig(max_new_tokens=40),
            )
        ),
    )

    async def update() -> None:
        await wait_for(lambda: sampler.stats()["steps"] >= 10)
        await sampler.update_weights(perturbed(model, scale=0.05), 1)

    async with anyio.create_task_group() as tg:
        tg.start_soon(update)
        groups = await engine.collect(2)
    await sampler.close()
    spanning = 0
    for g in groups:
        for traj in g.trajectories:
            traj = Trajectory.from_json(traj.to_json())  # what a JSONL dump or checkpoint keeps
            assert traj.status == "ok", traj.error
            pos = 0
            turns = iter(traj.turns)
            for seg in traj.segments:
                if seg.kind == "model":
                    turn = next(turns)
                    assert turn.on_update == "reprefill"
                    n_old = seg.versions.count(0)
                    if 0 < n_old < len(seg):  # the update came while this turn was sampled
                        spanning += 1
                        assert turn.reprefilled_tokens == pos + n_old - 1
                    else:
                        assert turn.reprefilled_tokens == 0
                pos += len(seg)
    assert spanning, [
        [s.versions for s in t.segments if s.kind == "model"]
        for g in groups
        for t in g.trajectories
    ]
