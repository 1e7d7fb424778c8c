"""Prefix reuse in the hf sampler: cached keys/values give the same tokens and behaviour
log-probs as a full forward, identical prompts are forwarded once, and nothing computed by
old weights survives an update."""

from __future__ import annotations

import pytest
import torch

from agentrl.models import load_model
from agentrl.samplers import SamplingParams
from agentrl.samplers.hf import HFSampler
from agentrl.samplers.prefix_cache import BLOCK, PrefixCache, Shared
from tests.samplers.test_hf import gather, perturbed, prompts, teacher_forced

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _kv(n: int, value: float = 0.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((2, n, 4), value), torch.full((2, n, 4), -value))]


def test_entries_sharing_a_storage_count_it_until_the_last_one_goes() -> None:
    cache = PrefixCache(max_tokens=3 * BLOCK)
    storage = torch.arange(2 * BLOCK * 2 * 4, dtype=torch.float32).view(2 * BLOCK, 2, 4)
    shared = Shared(2 * BLOCK)  # one gather for two rows: views of it, no copy
    a, b, c, d = ([i] * BLOCK for i in range(4))
    for tokens, part in ((a, storage[:BLOCK]), (b, storage[BLOCK:])):
        view = part.transpose(0, 1)
        cache.insert(tokens, [(view, view)], shared=shared)
    assert cache.tokens == 2 * BLOCK and len(cache) == 2
    assert cache.lookup([*b, 9])[1].kv[0][0].data_ptr() == storage[BLOCK:].data_ptr()
    cache.insert(c, _kv(BLOCK))
    assert cache.tokens == 3 * BLOCK
    # d evicts the least recent, a; the storage stays (b holds it), so b goes too
    cache.insert(d, _kv(BLOCK))
    assert len(cache) == 2 and cache.tokens == 2 * BLOCK
    assert cache.lookup([*a, 9])[1] is None and cache.lookup([*b, 9])[1] is None


def test_lookup_finds_the_longest_block_aligned_prefix_and_evicts_lru() -> None:
    cache = PrefixCache(max_tokens=4 * BLOCK)
    a = list(range(3 * BLOCK + 5))
    cache.insert(a, _kv(len(a), 1.0))
    assert cache.tokens == 3 * BLOCK  # trimmed to whole blocks
    n, entry = cache.lookup([*a[: 2 * BLOCK + 3], 999])
    assert n == 2 * BLOCK and entry is not None and entry.kv[0][0][0, 0, 0] == 1.0
    # one token must stay to be forwarded: a prompt equal to a cached block ends a block early
    assert cache.lookup(a[: 2 * BLOCK])[0] == BLOCK
    assert cache.lookup([7, *a])[0] == 0  # a different first block shares nothing
    # a second entry over the budget evicts the least recently used one
    b = [5000 + i for i in range(2 * BLOCK)]
    cache.insert(b, _kv(len(b), 2.0))
    assert len(cache) == 1 and cache.lookup([*a, 1])[0] == 0
    assert cache.lookup([*b, 1])[0] == 2 * BLOCK
    # the same prefix again is not stored twice
    cache.insert(b, _kv(len(b), 3.0))
    assert len(cache) == 1 and cache.tokens == 2 * BLOCK
    cache.clear()
    assert cache.lookup([*b, 1]) == (0, None) and cache.tokens == 0
    with pytest.raises(ValueError, match="prefix_cache_tokens"):
        PrefixCache(-1)


def test_stored_kv_is_a_copy_not_a_view_of_the_batch_cache() -> None:
    cache = PrefixCache(max_tokens=1000)
    keys = torch.zeros(2, BLOCK, 4)
    cache.insert(list(range(BLOCK)), [(keys, keys.clone())])
    keys.fill_(5.0)
    _, entry = cache.lookup(list(range(BLOCK + 1)))
    assert entry is not None and float(entry.kv[0][0].abs().sum()) == 0.0


def _long_prompt(tokenizer, i: int) -> list[int]:
    text = f"conversation {i}: " + "tell me about tools and code " * 6
    return list(tokenizer(text)["input_ids"])


async def test_a_next_turn_reuses_its_conversation_and_stays_exact() -> None:
    model, tokenizer = load_model("tiny-llama", dtype="float32")
    sampler = HFSampler(model, tokenizer, default_stop_token_ids=())
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=0)
    first = [_long_prompt(tokenizer, i) for i in range(3)]
    gens = await gather(sampler, [(p, params) for p in first])
    reused_before = sampler.stats()["prefix_reused_tokens"]
    # turn 2: the whole first turn plus an observation; one brand-new conversation beside them
    obs = list(tokenizer(" result: 42. go on")["input_ids"])
    second = [p + g.token_ids + obs for p, g in zip(first, gens, strict=True)]
    second.append(prompts(1, tokenizer)[0])
    prefilled = sampler.stats()["prefill_tokens"]
    gens2 = await gather(sampler, [(p, params) for p in second])
    stats = sampler.stats()
    assert stats["prefix_reused_tokens"] - reused_before >= 3 * 3 * BLOCK
    # far less than the 3 conversations were forwarded again
    assert stats["prefill_tokens"] - prefilled < sum(len(p) for p in second) / 2
    for prompt, gen in zip(second, gens2, strict=True):
        expected, _ = teacher_forced(model, prompt, gen.token_ids, 1.0)
        assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=1e-4)
    await sampler.close()


async def test_a_last_turn_keeps_only_its_prompt() -> None:
    """A request no later turn resends (``last_turn``: an episode's last allowed turn)
    leaves its prompt's blocks in the cache, for its group, but not its completion."""
    model, tokenizer = load_model("tiny-llama", dtype="float32")
    sampler = HFSampler(model, tokenizer, default_stop_token_ids=())
    prompt = _long_prompt(tokenizer, 2)
    blocks = len(prompt) // BLOCK * BLOCK
    params = SamplingParams(temperature=1.0, max_new_tokens=2 * BLOCK, seed=0)
    last = await sampler.generate(prompt, params.with_(last_turn=True))
    assert len(last.token_ids) == 2 * BLOCK
    assert sampler.stats()["prefix_cached_tokens"] == blocks
    # the same request on an earlier turn keeps the whole sequence for the next one
    again = await sampler.generate(prompt, params)
    held = (len(prompt) + len(again.token_ids) - 1) // BLOCK * BLOCK
    assert held > blocks
    assert sampler.stats()["prefix_cached_tokens"] == blocks + held
    await sampler.close()


async def test_a_group_of_identical_prompts_is_forwarded_once() -> None:
    model, tokenizer = load_model("tiny-llama", dtype="float32")
    sampler = HFSampler(model, tokenizer, default_stop_token_ids=(), max_batch_size=16)
    prompt = _long_prompt(tokenizer, 0)
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    gens = await gather(sampler, [(prompt, params)] * 8)
    # once per admission wave at most (a late arrival reuses the first one's blocks),
    # never once per sample
    assert sampler.stats()["prefill_tokens"] < 2 * len(prompt)
    assert len({tuple(g.token_ids) for g in gens}) > 1  # still independent samples
    for gen in gens:
        expected, _ = teacher_forced(model, prompt, gen.token_ids, 1.0)
        assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=1e-4)
    await sampler.close()


async def test_nothing_computed_by_old_weights_is_reused_after_an_update() -> None:
    model, tokenizer = load_model("tiny-llama", dtype="float32")
    sampler = HFSampler(model, tokenizer, default_stop_token_ids=())
    prompt = _long_prompt(tokenizer, 1)
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    first = await sampler.generate(prompt, params)
    follow = prompt + first.token_ids + [13, 14, 15]
    await sampler.update_weights(perturbed(model), 1)
    reused = sampler.stats()["prefix_reused_tokens"]
    after = await sampler.generate(follow, params)
    assert sampler.stats()["prefix_reused_tokens"] == reused
    expected, _ = teacher_forced(model, follow, after.token_ids, 0.0)
    assert torch.allclose(torch.tensor(after.logprobs), expected, atol=1e-4)
    # the new weights' own prefixes are reused again
    again = await sampler.generate(follow + after.token_ids + [16], params)
    assert sampler.stats()["prefix_reused_tokens"] > reused
    expected, _ = teacher_forced(model, follow + after.token_ids + [16], again.token_ids, 0.0)
    assert torch.allclose(torch.tensor(again.logprobs), expected, atol=1e-4)
    await sampler.close()


async def test_disabled_cache_reuses_nothing() -> None:
    model, tokenizer = load_model("tiny-llama", dtype="float32")
    sampler = HFSampler(model, tokenizer, default_stop_token_ids=(), prefix_cache_tokens=0)
    prompt = _long_prompt(tokenizer, 2)
    params = SamplingParams(temperature=0.0, max_new_tokens=4)
    first = await sampler.generate(prompt, params)
    await sampler.generate(prompt + first.token_ids + [13], params)
    assert sampler.stats()["prefix_reused_tokens"] == 0
    await sampler.close()
