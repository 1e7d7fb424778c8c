"""On CUDA: the hf sampler's decode step replayed as CUDA graphs (``kv_cache=static``,
``cuda_graphs=on``) gives what the eager paths give, and a weight update reaches the
replayed graphs (they read the parameters in place; the swap is a ``copy_`` into them)."""

from __future__ import annotations

import anyio
import torch

from agentrl.models import load_model, tiny_llama
from agentrl.samplers import SamplingParams
from agentrl.samplers.hf import HFSampler


def _prompts(tokenizer) -> list[list[int]]:
    texts = ["hello", "what is 2+2?", "write a poem about the sea", "x", "tools and code"]
    return [list(tokenizer(t)["input_ids"]) for t in texts]


def _generate(sampler, items) -> list:
    async def main():
        out = [None] * len(items)

        async def one(i, prompt, params):
            out[i] = await sampler.generate(prompt, params)

        try:
            async with anyio.create_task_group() as tg:
                for i, (prompt, params) in enumerate(items):
                    tg.start_soon(one, i, prompt, params)
        finally:
            await sampler.close()
        return out

    return anyio.run(main)


def test_graph_replay_gives_the_eager_tokens():
    model, tokenizer = load_model("tiny-llama", dtype="float32", device="cuda")
    items = [
        (p, SamplingParams(temperature=0.0 if i % 2 else 1.0, max_new_tokens=20 + 7 * i, seed=i))
        for i, p in enumerate(_prompts(tokenizer))
    ]
    runs = {}
    for name, options in {
        "graphs": {"kv_cache": "static", "cuda_graphs": "on"},
        "static eager": {"kv_cache": "static", "cuda_graphs": "off"},
        "growing": {},
    }.items():
        sampler = HFSampler(
            model, tokenizer, default_stop_token_ids=(), max_batch_size=4, **options
        )
        runs[name] = (_generate(sampler, items), sampler.stats())
    gens, stats = runs["graphs"]
    assert stats["cuda_graphs"] > 0 and stats["graph_replays"] > 0, stats
    assert stats["graph_fallbacks"] == 0
    assert runs["static eager"][1]["cuda_graphs"] == 0
    for other in ("static eager", "growing"):
        for g, e in zip(gens, runs[other][0], strict=True):
            assert g.token_ids == e.token_ids, other
            torch.testing.assert_close(
                torch.tensor(g.logprobs), torch.tensor(e.logprobs), atol=1e-4, rtol=1e-4
            )


def test_replayed_graphs_see_a_weight_update():
    model, tokenizer = load_model("tiny-llama", dtype="float32", device="cuda")
    sampler = HFSampler(
        model, tokenizer, default_stop_token_ids=(), kv_cache="static", cuda_graphs="on"
    )
    prompt = _prompts(tokenizer)[2]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=40)
    learner = tiny_llama(0).cuda()
    with torch.no_grad():
        for p in learner.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    new = {k: v.detach().clone() for k, v in learner.state_dict().items()}
    pointers = {k: v.data_ptr() for k, v in model.state_dict().items()}

    async def main():
        try:
            before = await sampler.generate(prompt, greedy)  # captures the buckets it uses
            captured = sampler.stats()["cuda_graphs"]
            await sampler.update_weights(new, 1)
            after = await sampler.generate(prompt, greedy)  # replays the same graphs
            return before, after, captured, sampler.stats()
        finally:
            await sampler.close()

    before, after, captured, stats = anyio.run(main)
    assert captured > 0 and stats["cuda_graphs"] == captured  # no recapture: same graphs
    assert {k: v.data_ptr() for k, v in model.state_dict().items()} == pointers
    assert after.versions == [1] * 40
    reference_model, _ = load_model("tiny-llama", dtype="float32", device="cuda")
    reference_model.load_state_dict(new)
    reference = HFSampler(reference_model, tokenizer, default_stop_token_ids=())
    expected = _generate(reference, [(prompt, greedy)])[0]
    assert after.token_ids == expected.token_ids != before.token_ids
