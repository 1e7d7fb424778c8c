"""The hf sampler's fixed-slot path (``kv_cache=static``, the decode step CUDA graphs replay)
run eagerly on the CPU against the growing cache: same tokens, same log-probs, with rows
joining and leaving, prefix-cache reuse, weight updates and contexts at their limit."""

from __future__ import annotations

import anyio
import pytest
import torch

from agentrl.models import cache_kwargs, load_model
from agentrl.run.settings import resolve
from agentrl.samplers import SamplingParams
from agentrl.samplers.hf import HFSampler
from agentrl.samplers.static_cache import batch_bucket, length_bucket
from tests.samplers import test_hf, test_interruptible
from tests.samplers.test_hf import gather, prompts, wait_for

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    return load_model("tiny-llama", dtype="float32", seed=0)


@pytest.fixture
def static_by_default(monkeypatch):
    """HFSampler(...) without a kv_cache argument builds the static path."""
    init = HFSampler.__init__

    def static_init(self, *args, **kwargs):
        kwargs.setdefault("kv_cache", "static")
        init(self, *args, **kwargs)

    monkeypatch.setattr(HFSampler, "__init__", static_init)


def test_buckets() -> None:
    assert [batch_bucket(n, 128) for n in (1, 2, 3, 5, 33, 128)] == [1, 2, 4, 8, 64, 128]
    assert batch_bucket(100, 96) == 96  # the last bucket is max_batch_size
    assert [length_bucket(n, 4096) for n in (1, 64, 65, 300, 4096)] == [64, 64, 128, 512, 4096]
    assert length_bucket(700, 600) == 600


async def _run(pair, kv_cache: str, waves, **options):
    """Generations of `waves` (lists of (prompt, params)); each wave starts once the
    sampler has made two decode steps more than when the previous one started."""
    model, tokenizer = pair
    sampler = HFSampler(model, tokenizer, default_stop_token_ids=(), kv_cache=kv_cache, **options)
    results: list = []

    async def one(prompt, params) -> None:
        results.append((prompt, params, await sampler.generate(prompt, params)))

    async with anyio.create_task_group() as tg:
        steps = 0
        for n, wave in enumerate(waves):
            if n:  # the rows of the waves before are decoding
                await wait_for(lambda s=steps: sampler.stats()["steps"] >= s + 2)
            steps = sampler.stats()["steps"]
            for prompt, params in wave:
                tg.start_soon(one, prompt, params)
    stats = sampler.stats()
    await sampler.close()
    return {(tuple(p), params.seed): g for p, params, g in results}, stats


# every mode behind the sampler's one KV interface (samplers/batch_kv.py)
@pytest.mark.parametrize("mode", ["static", "dynamic"])
async def test_rows_joining_and_leaving_match_the_growing_cache(pair, mode: str) -> None:
    _, tokenizer = pair
    batch = prompts(9, tokenizer)
    waves = [
        [(p, SamplingParams(temperature=0.0, max_new_tokens=6 + 5 * i, seed=i))]
        for i, p in enumerate(batch[:3])
    ] + [
        [
            (p, SamplingParams(temperature=1.0, max_new_tokens=4 + 3 * i, seed=10 + i))
            for i, p in enumerate(batch[3:])
        ]
    ]
    growing, _ = await _run(pair, "growing", waves, max_batch_size=5)
    static, stats = await _run(pair, mode, waves, max_batch_size=5)
    assert growing.keys() == static.keys()
    for key, g in growing.items():
        s = static[key]
        assert s.token_ids == g.token_ids, key
        torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(g.logprobs))
    assert stats["steps"] > 0 and stats["cuda_graphs"] == 0 and stats["graph_fallbacks"] == 0


async def test_prefix_cache_reuse_and_the_context_limit_match(pair) -> None:
    _, tokenizer = pair
    first = prompts(1, tokenizer)[0] * 3  # > one 16-token block
    params = SamplingParams(temperature=0.0, max_new_tokens=200)
    outs = {}
    for kv_cache in ("growing", "static"):
        model, tok = pair
        sampler = HFSampler(
            model, tok, default_stop_token_ids=(), kv_cache=kv_cache, max_context=96
        )
        a = await sampler.generate(first, params.with_(max_new_tokens=20))
        follow = first + a.token_ids + tokenizer(" and then")["input_ids"]
        b, c = await gather(sampler, [(follow, params), (first, params)])
        stats = sampler.stats()
        await sampler.close()
        assert stats["prefix_reused_tokens"] > 0
        # both run into max_context: the static cache's capacity
        assert b.finish_reason == c.finish_reason == "length"
        assert len(follow) + len(b.token_ids) == 96 == len(first) + len(c.token_ids)
        outs[kv_cache] = [a.token_ids, b.token_ids, c.token_ids]
    assert outs["static"] == outs["growing"]


def test_cuda_graphs_on_needs_the_static_cache_on_cuda(pair) -> None:
    model, tokenizer = pair
    with pytest.raises(
        ValueError, match="cuda_graphs=on needs kv_cache=static and a model on a CUDA"
    ):
        HFSampler(model, tokenizer, kv_cache="static", cuda_graphs="on")
    with pytest.raises(ValueError, match="cuda_graphs must be one of auto, on, off"):
        HFSampler(model, tokenizer, cuda_graphs="yes")
    sampler = HFSampler(model, tokenizer, kv_cache="static")  # auto: eager on the CPU
    assert sampler.cuda_graphs is False and sampler.stats()["cuda_graphs"] == 0


# the growing cache's own exactness and update tests, run again on the static path


async def test_static_logprobs_equal_a_teacher_forced_forward(static_by_default, pair) -> None:
    params = SamplingParams(
        temperature=0.7, top_p=0.9, top_k=50, max_new_tokens=16, seed=3, return_entropy=True
    )
    await test_hf.test_behaviour_logprobs_equal_teacher_forced_forward(pair, params)


async def test_static_greedy_batched_equals_one_at_a_time(static_by_default, pair) -> None:
    await test_hf.test_greedy_batched_equals_one_at_a_time(pair)


async def test_static_cancelling_a_caller_frees_its_slot(static_by_default, pair) -> None:
    await test_hf.test_cancelling_a_caller_frees_its_slot(pair)


async def test_static_tokens_across_an_update_carry_both_versions(static_by_default) -> None:
    await test_hf.test_tokens_across_an_update_carry_both_versions_in_order()


async def test_static_reprefill_samples_exactly_from_the_new_weights(static_by_default) -> None:
    await test_interruptible.test_reprefill_samples_exactly_from_the_new_weights(64)


async def test_static_drain_finishes_in_flight_on_old_weights(static_by_default) -> None:
    await test_hf.test_on_update_drain_finishes_in_flight_on_old_weights()


def test_the_options_reach_the_sampler_from_a_config() -> None:
    from tests.test_runtime import _cfg

    cfg = _cfg(
        "sampler.options.kv_cache=static",
        "sampler.options.cuda_graphs=off",
        "sampler.options.max_context=256",
    )
    sampler = HFSampler.from_settings(resolve(cfg).sampler)
    assert sampler.kv_cache == "static" and sampler.cuda_graphs is False
    assert sampler.context_length == 256
    with pytest.raises(ValueError, match="cuda_graphs=on needs kv_cache=static"):
        HFSampler.from_settings(resolve(_cfg("sampler.options.cuda_graphs=on")).sampler)


def test_a_step_past_the_slots_capacity_is_refused(pair) -> None:
    """Unreachable through the sampler (rows finish at max_context, which is the capacity);
    the cache itself refuses instead of writing out of bounds."""
    from agentrl.samplers.kv_cache import GrowingCache
    from agentrl.samplers.static_cache import SlotCache

    model, _ = pair
    prefill = GrowingCache()
    with torch.inference_mode():
        model(
            input_ids=torch.tensor([[1, 2, 3, 4]]), use_cache=True, **cache_kwargs(model, prefill)
        )
    slots = SlotCache(2, 4, torch.device("cpu"), graphs=False)
    slots.merge(prefill, 4)
    with pytest.raises(ValueError, match="holds 4 positions and this step needs 5: raise the"):
        slots.decode(model, [5], [0])
    with pytest.raises(ValueError, match="3 rows do not fit 2 slots"):
        slots.merge(_two_rows(model), 2)


def _two_rows(model):
    from agentrl.samplers.kv_cache import GrowingCache

    cache = GrowingCache()
    with torch.inference_mode():
        model(
            input_ids=torch.tensor([[1, 2], [3, 4]]), use_cache=True, **cache_kwargs(model, cache)
        )
    return cache
