"""The vllm sampler on the real SmolLM2-135M (run in .venv-vllm: `make test-vllm`).

One engine for the whole module (engine start is ~25 s on 2 cores). The engine's event loop
runs in a blocking portal thread so the tests stay plain functions.
"""

from __future__ import annotations

import json
import math
import os

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
pytest.importorskip("vllm", reason="needs .venv-vllm (make test-vllm)")

import anyio  # noqa: E402
import torch  # noqa: E402
from anyio.from_thread import start_blocking_portal  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from agentrl.errors import PromptError, WeightUpdateError  # noqa: E402
from agentrl.models import resolve_model_dir  # noqa: E402
from agentrl.samplers.base import SamplingParams  # noqa: E402
from agentrl.samplers.vllm import VLLMSampler  # noqa: E402
from tests.waiting import wait_until_async  # noqa: E402

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "Once upon a time, a small robot",
]
RESULTS = os.environ.get("AGENTRL_VLLM_RESULTS")  # optional JSON file for the measured gap


@pytest.fixture(scope="module")
def model_dir():
    return resolve_model_dir("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def portal():
    with start_blocking_portal(backend="asyncio") as p:
        yield p


@pytest.fixture(scope="module")
def sampler(portal, model_dir):
    s = VLLMSampler(model_dir, dtype="float32", max_model_len=1024, max_batch_size=16)
    portal.call(s.start)
    yield s
    portal.call(s.close)


@pytest.fixture(scope="module")
def tokenizer(sampler):
    return sampler.tokenizer


@pytest.fixture(scope="module")
def original_weights(model_dir):
    return load_file(str(model_dir / "model.safetensors"))


def _ids(tokenizer, text):
    return tokenizer(text)["input_ids"]


GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


def test_generate_returns_tokens_logprobs_and_versions(sampler, portal, tokenizer):
    gen = portal.call(sampler.generate, _ids(tokenizer, PROMPTS[0]), GREEDY)
    assert 1 <= len(gen) <= 12
    assert len(gen.logprobs) == len(gen.token_ids) == len(gen.versions)
    assert all(v == sampler.version for v in gen.versions)
    assert all(lp <= 0 for lp in gen.logprobs)
    assert gen.finish_reason in ("stop", "length")
    assert gen.metadata["logprobs"] == "exact"
    # greedy is deterministic
    again = portal.call(sampler.generate, _ids(tokenizer, PROMPTS[0]), GREEDY)
    assert again.token_ids == gen.token_ids


def test_concurrent_callers_all_finish_and_match_solo_greedy(sampler, portal, tokenizer):
    params = GREEDY.with_(max_new_tokens=8)
    prompts = [_ids(tokenizer, p) for p in PROMPTS]
    solo = [portal.call(sampler.generate, p, params).token_ids for p in prompts]

    async def many():
        out = {}

        async def one(i):
            out[i] = (await sampler.generate(prompts[i % len(prompts)], params)).token_ids

        async with anyio.create_task_group() as tg:
            for i in range(24):
                tg.start_soon(one, i)
        return out

    out = portal.call(many)
    assert len(out) == 24
    assert all(out[i] == solo[i % len(prompts)] for i in range(24))


def test_logprob_gap_vs_teacher_forced_hf(sampler, portal, tokenizer, model_dir):
    """Measure (and report) the behaviour-logprob gap vs an fp32 HF forward pass."""
    from transformers import AutoModelForCausalLM

    temperature = 0.7  # != 1, so a pre-temperature (raw) logprob would be far off
    params = SamplingParams(temperature=temperature, max_new_tokens=32, seed=1, return_entropy=True)
    prompts = [_ids(tokenizer, p) for p in PROMPTS]

    async def sample_all():
        out = [None] * len(prompts)

        async def one(i):
            out[i] = await sampler.generate(prompts[i], params.with_(seed=i))

        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
        return out

    gens = portal.call(sample_all)
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    gaps, entropy_gaps = [], []
    for prompt, gen in zip(prompts, gens, strict=True):
        ids = torch.tensor([prompt + gen.token_ids])
        with torch.no_grad():
            logits = hf(ids).logits[0, len(prompt) - 1 : -1].float()
        logp = torch.log_softmax(logits / temperature, dim=-1)
        ref = logp.gather(-1, torch.tensor(gen.token_ids)[:, None])[:, 0]
        gaps += (torch.tensor(gen.logprobs) - ref).abs().tolist()
        exact_entropy = -(logp.exp() * logp).sum(-1)
        entropy_gaps += (exact_entropy - torch.tensor(gen.entropies)).tolist()
    report = {
        "tokens": len(gaps),
        "temperature": temperature,
        "dtype": "float32",
        "logprob_abs_gap_mean": sum(gaps) / len(gaps),
        "logprob_abs_gap_max": max(gaps),
        "entropy_top20_underestimate_mean": sum(entropy_gaps) / len(entropy_gaps),
        "entropy_top20_underestimate_max": max(entropy_gaps),
    }
    print("\nvllm vs HF teacher-forced:", json.dumps(report))
    if RESULTS:
        with open(RESULTS, "w") as f:
            json.dump(report, f, indent=2)
    # loose sanity bounds: a definition mismatch (raw vs tempered) gives gaps of ~0.5+
    assert report["logprob_abs_gap_mean"] < 0.02
    # the top-k entropy is a lower bound of the exact entropy (up to float noise)
    assert min(entropy_gaps) > -1e-3


def test_bad_prompts_are_rejected(sampler, portal, tokenizer):
    with pytest.raises(PromptError, match="empty"):
        portal.call(sampler.generate, [], GREEDY)
    with pytest.raises(PromptError, match="context"):
        portal.call(sampler.generate, [1] * 2000, GREEDY)
    with pytest.raises(PromptError, match="vocabulary"):
        portal.call(sampler.generate, [1, 10**7], GREEDY)


def test_cancelling_a_caller_frees_its_request(sampler, portal, tokenizer):
    params = SamplingParams(temperature=1.0, max_new_tokens=400, seed=3)

    def unfinished() -> int:
        return sampler.engine.output_processor.get_num_unfinished_requests()

    async def cancel_midway():
        finished = []

        async def run() -> None:
            await sampler.generate(_ids(tokenizer, PROMPTS[1]), params)
            finished.append(True)

        sampler.ignore_eos = True  # 400 tokens: the request is still running when cancelled
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                # cancel once vLLM holds the request
                await wait_until_async(lambda: finished or unfinished() == 1, "the request in")
                tg.cancel_scope.cancel()
        finally:
            sampler.ignore_eos = False
        # the cancelled stream's close aborts the request in the engine
        await wait_until_async(lambda: unfinished() == 0, "the cancelled request freed")
        return finished, unfinished()

    assert portal.call(cancel_midway) == ([], 0)


def _perturbed(original):
    gen = torch.Generator().manual_seed(0)
    out = dict(original)
    for k, v in original.items():
        if "mlp.down_proj" in k:
            out[k] = v + torch.randn(v.shape, generator=gen) * v.std() * 2
    return out


def test_update_changes_outputs_and_versions(sampler, portal, tokenizer, original_weights):
    prompt = _ids(tokenizer, PROMPTS[2])
    before = portal.call(sampler.generate, prompt, GREEDY)
    v0 = sampler.version
    portal.call(sampler.update_weights, _perturbed(original_weights), v0 + 1)
    assert sampler.version == v0 + 1
    print(
        f"\nreload (state dict -> /dev/shm -> reload_weights): {sampler.last_update_seconds:.2f}s"
    )
    after = portal.call(sampler.generate, prompt, GREEDY)
    assert after.token_ids != before.token_ids
    assert after.versions == [v0 + 1] * len(after)
    # back to the original weights: the original output comes back exactly
    portal.call(sampler.update_weights, original_weights, v0 + 2)
    restored = portal.call(sampler.generate, prompt, GREEDY)
    assert restored.token_ids == before.token_ids
    assert restored.versions == [v0 + 2] * len(restored)


def test_tokens_across_an_update_carry_both_versions(sampler, portal, tokenizer, original_weights):
    params = SamplingParams(temperature=1.0, max_new_tokens=200, seed=5)
    v0 = sampler.version
    prompt = _ids(tokenizer, PROMPTS[3])

    async def generate_across_update():
        result = {}

        async def gen():
            result["gen"] = await sampler.generate(prompt, params)

        sampler.ignore_eos = True
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(gen)
                # the long request is in the engine; a 32-token one beside it finishing
                # means 32 decode steps ran with both in the batch: the long one holds
                # ~32 tokens of v0 and has ~170 to go when the update lands
                await wait_until_async(
                    lambda: sampler.engine.output_processor.get_num_unfinished_requests() == 1,
                    "the long request in the engine",
                )
                beside = await sampler.generate(prompt, params.with_(max_new_tokens=32, seed=6))
                assert len(beside) == 32 and "gen" not in result
                await sampler.update_weights(original_weights, v0 + 1)
        finally:
            sampler.ignore_eos = False
        return result["gen"]

    gen = portal.call(generate_across_update)
    assert len(gen) == 200
    n_old = gen.versions.count(v0)
    n_new = gen.versions.count(v0 + 1)
    print(f"\npartial rollout: {n_old} tokens on v{v0}, {n_new} on v{v0 + 1}")
    assert n_old > 0 and n_new > 0 and n_old + n_new == 200
    assert gen.versions == sorted(gen.versions)  # old first, then new, never interleaved


def test_bad_weights_are_rejected_and_old_version_kept(
    sampler, portal, tokenizer, original_weights
):
    prompt = _ids(tokenizer, PROMPTS[0])
    before = portal.call(sampler.generate, prompt, GREEDY)
    v = sampler.version
    missing = {k: t for k, t in original_weights.items() if "layers.3." not in k}
    with pytest.raises(WeightUpdateError, match="missing"):
        portal.call(sampler.update_weights, missing, v + 1)
    extra = {**original_weights, "model.layers.99.mlp.up_proj.weight": torch.zeros(2, 2)}
    with pytest.raises(WeightUpdateError, match="unexpected"):
        portal.call(sampler.update_weights, extra, v + 1)
    shape = dict(original_weights)
    shape["model.norm.weight"] = torch.ones(7)
    with pytest.raises(WeightUpdateError, match="shape"):
        portal.call(sampler.update_weights, shape, v + 1)
    with pytest.raises(WeightUpdateError, match="only go up"):
        portal.call(sampler.update_weights, original_weights, v)
    assert sampler.version == v
    after = portal.call(sampler.generate, prompt, GREEDY)
    assert after.token_ids == before.token_ids and after.versions == [v] * len(after)


def test_update_from_a_folder(sampler, portal, model_dir, tokenizer):
    portal.call(sampler.update_weights, model_dir, sampler.version + 1)
    gen = portal.call(sampler.generate, _ids(tokenizer, PROMPTS[0]), GREEDY)
    assert set(gen.versions) == {sampler.version}
    assert not math.isnan(sum(gen.logprobs))
