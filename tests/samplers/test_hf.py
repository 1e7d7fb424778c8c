"""The embedded hf sampler on the tiny random Llama (fp32): exactness, batching, updates."""

from __future__ import annotations

import anyio
import pytest
import torch

from agentrl.errors import PromptError, UnknownNameError, WeightUpdateError
from agentrl.models import load_model
from agentrl.samplers import SamplingParams, create_sampler
from agentrl.samplers.hf import HFSampler
from tests.waiting import wait_until_async

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def pair():
    return load_model("tiny-llama", dtype="float32")


def prompts(n: int, tokenizer) -> list[list[int]]:
    texts = [
        "hello",
        "what is 2+2?",
        "write a poem about the sea",
        "x",
        "tools and code",
        "abc " * 9,
    ]
    out = []
    for i in range(n):
        ids = tokenizer(texts[i % len(texts)] + f" #{i}")["input_ids"]
        out.append(list(ids))
    return out


def teacher_forced(model, prompt: list[int], tokens: list[int], temperature: float):
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    if temperature > 0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, -1)
    chosen = logp.gather(-1, torch.tensor(tokens).unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return chosen, entropy


async def gather(sampler, items):
    results = [None] * len(items)

    async def one(i, prompt, params):
        results[i] = await sampler.generate(prompt, params)

    async with anyio.create_task_group() as tg:
        for i, (prompt, params) in enumerate(items):
            tg.start_soon(one, i, prompt, params)
    return results


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, max_new_tokens=16, return_entropy=True),
        SamplingParams(
            temperature=0.7, top_p=0.9, top_k=50, max_new_tokens=16, seed=3, return_entropy=True
        ),
        SamplingParams(temperature=1.3, max_new_tokens=16, return_entropy=True),
    ],
)
async def test_behaviour_logprobs_equal_teacher_forced_forward(pair, params):
    model, tokenizer = pair
    sampler = HFSampler(model, tokenizer, default_stop_token_ids=())
    batch = prompts(5, tokenizer)  # different lengths: padded rows decode together
    gens = await gather(sampler, [(p, params) for p in batch])
    for prompt, gen in zip(batch, gens, strict=True):
        assert len(gen.token_ids) == 16 and gen.finish_reason == "length"
        expected, entropy = teacher_forced(model, prompt, gen.token_ids, params.temperature)
        assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=1e-4)
        assert torch.allclose(torch.tensor(gen.entropies), entropy, atol=1e-4)
        assert gen.versions == [0] * 16
    await sampler.close()


async def test_greedy_batched_equals_one_at_a_time(pair):
    model, tokenizer = pair
    sampler = HFSampler(model, tokenizer, max_batch_size=4)
    params = SamplingParams(temperature=0.0, max_new_tokens=24)
    batch = prompts(6, tokenizer)
    alone = [(await sampler.generate(p, params)).token_ids for p in batch]
    together = [g.token_ids for g in await gather(sampler, [(p, params) for p in batch])]
    assert together == alone
    await sampler.close()


async def test_seeded_sampling_is_reproducible_under_concurrency(pair):
    model, tokenizer = pair
    sampler = HFSampler(model, tokenizer, default_stop_token_ids=())
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7)
    prompt = prompts(1, tokenizer)[0]
    alone = (await sampler.generate(prompt, params)).token_ids
    others = [
        (p, SamplingParams(temperature=1.0, max_new_tokens=20)) for p in prompts(5, tokenizer)
    ]
    gens = await gather(sampler, [*others, (prompt, params)])
    assert gens[-1].token_ids == alone
    different = await sampler.generate(prompt, params.with_(seed=8))
    assert different.token_ids != alone
    await sampler.close()


async def test_64_concurrent_callers_all_finish(pair):
    model, tokenizer = pair
    sampler = HFSampler(model, tokenizer, max_batch_size=16, default_stop_token_ids=())
    items = [
        (p, SamplingParams(temperature=1.0, max_new_tokens=4 + i % 9, seed=i))
        for i, p in enumerate(prompts(64, tokenizer))
    ]
    gens = await gather(sampler, items)
    assert [len(g.token_ids) for g in gens] == [4 + i % 9 for i in range(64)]
    assert all(g.finish_reason == "length" for g in gens)
    assert sampler.stats()["active"] == 0
    await sampler.close()


async def wait_for(condition) -> None:
    """The sampler's counters advance inside its own tasks: wait for one to get there."""
    await wait_until_async(condition, "the sampler's counter", interval=0.005)


async def test_cancelling_a_caller_frees_its_slot(pair):
    model, tokenizer = pair
    sampler = HFSampler(model, tokenizer, max_batch_size=1, default_stop_token_ids=())
    prompt = prompts(1, tokenizer)[0]
    long = SamplingParams(temperature=1.0, max_new_tokens=1900)
    async with anyio.create_task_group() as tg:
        tg.start_soon(sampler.generate, prompt, long)
        await wait_for(lambda: sampler.stats()["tokens"] > 3)
        assert sampler.stats()["active"] == 1
        tg.cancel_scope.cancel()
    await wait_for(lambda: sampler.stats()["active"] == 0)
    # the single slot is free again: a new request runs to completion
    gen = await sampler.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=5))
    assert len(gen.token_ids) == 5
    await sampler.close()


async def test_stop_token_ids_stop_strings_and_max_new_tokens(pair):
    model, tokenizer = pair
    sampler = HFSampler(model, tokenizer, default_stop_token_ids=())
    prompt = prompts(1, tokenizer)[0]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    free = (await sampler.generate(prompt, greedy)).token_ids
    assert len(free) == 12

    stop_id = free[4]
    stopped = await sampler.generate(prompt, greedy.with_(stop_token_ids=(stop_id,)))
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free[: free.index(stop_id) + 1]

    stop_text = tokenizer.decode(free[3:5])
    by_text = await sampler.generate(prompt, greedy.with_(stop=(stop_text,)))
    assert by_text.finish_reason == "stop"
    assert stop_text in tokenizer.decode(by_text.token_ids)
    assert stop_text not in tokenizer.decode(by_text.token_ids[:-1])
    await sampler.close()


def perturbed(model, scale: float = 0.5, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}


async def test_update_weights_changes_outputs_and_version():
    model, tokenizer = load_model("tiny-llama")
    sampler = HFSampler(model, tokenizer, default_stop_token_ids=())
    prompt = prompts(1, tokenizer)[0]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
    before = await sampler.generate(prompt, greedy)
    new_weights = perturbed(model)
    await sampler.update_weights(new_weights, 1)
    assert sampler.version == 1
    after = await sampler.generate(prompt, greedy)
    assert after.versions == [1] * 10
    assert after.token_ids != before.token_ids
    # and the new tokens are exactly what the new weights give
    expected, _ = teacher_forced(model, prompt, after.token_ids, 0.0)
    assert torch.allclose(torch.tensor(after.logprobs), expected, atol=1e-4)
    assert torch.equal(model.state_dict()["model.norm.weight"], new_weights["model.norm.weight"])
    await sampler.close()


async def test_tokens_across_an_update_carry_both_versions_in_order():
    model, tokenizer = load_model("tiny-llama")
    sampler = HFSampler(model, tokenizer, default_stop_token_ids=())
    prompt = prompts(1, tokenizer)[0]
    result = {}

    async def run() -> None:
        result["gen"] = await sampler.generate(
            prompt, SamplingParams(temperature=1.0, max_new_tokens=400)
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await wait_for(lambda: sampler.stats()["tokens"] > 5)
        await sampler.update_weights(perturbed(model), 1)
    versions = result["gen"].versions
    assert versions[0] == 0 and versions[-1] == 1
    assert versions == sorted(versions)
    await sampler.close()


async def test_on_update_drain_finishes_in_flight_on_old_weights():
    model, tokenizer = load_model("tiny-llama")
    sampler = HFSampler(model, tokenizer, on_update="drain", default_stop_token_ids=())
    prompt = prompts(1, tokenizer)[0]
    result = {}

    async def run() -> None:
        result["gen"] = await sampler.generate(
            prompt, SamplingParams(temperature=1.0, max_new_tokens=300)
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await wait_for(lambda: sampler.stats()["tokens"] > 5)
        await sampler.update_weights(perturbed(model), 1)
        assert "gen" in result  # the update waited for the in-flight sequence
    assert result["gen"].versions == [0] * 300
    later = await sampler.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=3))
    assert later.versions == [1, 1, 1]
    await sampler.close()


async def test_bad_weights_are_rejected_and_the_old_version_kept():
    model, tokenizer = load_model("tiny-llama")
    sampler = HFSampler(model, tokenizer)
    prompt = prompts(1, tokenizer)[0]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    before = await sampler.generate(prompt, greedy)

    missing = perturbed(model)
    del missing["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(
        WeightUpdateError, match=r"missing keys \[model\.layers\.1\.mlp\.up_proj\.weight\]"
    ):
        await sampler.update_weights(missing, 1)
    extra = {**perturbed(model), "model.layers.9.bogus": torch.zeros(3)}
    with pytest.raises(WeightUpdateError, match=r"unexpected keys \[model\.layers\.9\.bogus\]"):
        await sampler.update_weights(extra, 1)
    shape = perturbed(model)
    shape["model.norm.weight"] = torch.zeros(65)
    with pytest.raises(WeightUpdateError, match=r"model\.norm\.weight"):
        await sampler.update_weights(shape, 1)
    with pytest.raises(WeightUpdateError, match=r"neither a \.safetensors file"):
        await sampler.update_weights("/nonexistent/weights", 1)

    assert sampler.version == 0
    assert (await sampler.generate(prompt, greedy)).token_ids == before.token_ids

    await sampler.update_weights(perturbed(model), 2)
    with pytest.raises(WeightUpdateError, match="only go up"):
        await sampler.update_weights(perturbed(model), 2)
    assert sampler.version == 2
    await sampler.close()


async def test_bad_prompts_name_the_problem(pair):
    model, tokenizer = pair
    sampler = HFSampler(model, tokenizer, max_context=64)
    with pytest.raises(PromptError, match="empty"):
        await sampler.generate([], SamplingParams())
    with pytest.raises(PromptError, match="prompt has 64 tokens but the context is 64"):
        await sampler.generate([5] * 64, SamplingParams())
    with pytest.raises(PromptError, match="outside the vocabulary"):
        await sampler.generate([5, 10**6], SamplingParams())
    # generation stops at the context limit
    gen = await sampler.generate([5] * 60, SamplingParams(temperature=0.0, max_new_tokens=50))
    assert len(gen.token_ids) <= 4
    await sampler.close()


async def test_create_sampler_from_name_and_pair(pair):
    sampler = create_sampler("hf", model="tiny-llama", max_batch_size=2)
    assert sampler.backend == "hf" and sampler.version == 0
    other = create_sampler("hf", model=pair)
    prompt = prompts(1, pair[1])[0]
    params = SamplingParams(temperature=0.0, max_new_tokens=5)
    a, b = await sampler.generate(prompt, params), await other.generate(prompt, params)
    assert a.token_ids == b.token_ids  # seeded tiny-llama: same weights from the name
    many = await sampler.generate_many(prompt, SamplingParams(n=3, max_new_tokens=4, seed=1))
    assert len(many) == 3
    with pytest.raises(TypeError, match="did you mean 'max_batch_size'"):
        create_sampler("hf", model=pair, max_batch=3)
    with pytest.raises(UnknownNameError, match="did you mean 'hf'"):
        create_sampler("hff", model="tiny-llama")
    await sampler.close()
    await other.close()
