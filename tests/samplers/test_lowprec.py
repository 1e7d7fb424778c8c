"""The hf sampler with low-precision weights (sampler.weight_precision) on the tiny Llama:
valid tokens, a small bounded log-prob gap to the float32 learner, requantized on publish."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchao")

from agentrl.errors import ConfigError
from agentrl.learner.precision import Precision
from agentrl.learner.proximal import bypass_blockers
from agentrl.models import load_model
from agentrl.run.settings import resolve
from agentrl.samplers import SamplingParams, sampler_options
from agentrl.samplers.hf import HFSampler
from tests.samplers.test_hf import teacher_forced
from tests.test_runtime import _cfg

pytestmark = pytest.mark.anyio

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=24, seed=5)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _int8_sampler(seed: int = 0) -> tuple[HFSampler, object]:
    model, tokenizer = load_model("tiny-llama", dtype="float32", seed=seed)  # quantized in place
    return HFSampler(model, tokenizer, default_stop_token_ids=(), weight_precision="int8"), model


def _gap(model, prompt: list[int], gen) -> torch.Tensor:
    expected, _ = teacher_forced(model, prompt, gen.token_ids, PARAMS.temperature)
    return (torch.tensor(gen.logprobs) - expected).abs()


async def test_int8_tokens_are_valid_and_logprobs_close_to_the_float32_learner():
    learner, tokenizer = load_model("tiny-llama", dtype="float32")
    sampler, model = _int8_sampler()
    try:
        head = model.get_output_embeddings().weight
        q_proj = model.model.layers[0].self_attn.q_proj.weight
        assert type(q_proj).__name__ == "Int8Tensor" and type(head) is torch.nn.Parameter
        prompt = list(tokenizer("what is 2+2?")["input_ids"])
        gen = await sampler.generate(prompt, PARAMS)
        assert len(gen.token_ids) == PARAMS.max_new_tokens
        assert all(0 <= t < sampler.vocab_size for t in gen.token_ids)
        assert all(lp <= 0.0 for lp in gen.logprobs)
        gap = _gap(learner, prompt, gen)
        # int8 per-row rounding moves log-probs a little, not nothing and not much
        assert 1e-6 < gap.mean().item() < 0.01 and gap.max().item() < 0.05, gap
    finally:
        await sampler.close()


async def test_a_publish_requantizes_the_new_weights():
    sampler, model = _int8_sampler()
    old, tokenizer = load_model("tiny-llama", dtype="float32")
    new, _ = load_model("tiny-llama", dtype="float32", seed=1)
    prompt = list(tokenizer("hello")["input_ids"])
    try:
        before = await sampler.generate(prompt, PARAMS)
        await sampler.update_weights(new.state_dict(), version=1)
        after = await sampler.generate(prompt, PARAMS)
        assert after.versions == [1] * len(after.token_ids)
        assert type(model.model.layers[1].mlp.down_proj.weight).__name__ == "Int8Tensor"
        # the sampled log-probs are the new weights' (within int8 rounding), not the old ones'
        assert _gap(new, prompt, after).mean().item() < 0.01
        assert _gap(old, prompt, after).mean().item() > 0.05
        assert before.logprobs != after.logprobs
    finally:
        await sampler.close()


def test_bad_values_name_the_key():
    with pytest.raises(ConfigError, match=r"sampler.weight_precision"):
        _cfg("sampler.weight_precision=int4")
    model, tokenizer = load_model("tiny-llama", dtype="float32")
    with pytest.raises(ConfigError, match=r"sampler.weight_precision must be one of"):
        HFSampler(model, tokenizer, weight_precision="int4")
    with pytest.raises(ConfigError, match=r"sampler.weight_precision=fp8 needs a CUDA GPU"):
        HFSampler(model, tokenizer, weight_precision="fp8")  # the tiny model is on the CPU
    with pytest.raises(
        ConfigError, match=r"sampler.weight_precision=int8 is for sampler.backend=hf"
    ):
        sampler_options(
            resolve(_cfg("sampler.backend=vllm", "sampler.weight_precision=int8")).sampler
        )


def test_settings_reach_the_sampler_and_the_learner():
    settings = resolve(_cfg("sampler.weight_precision=int8"))
    assert sampler_options(settings.sampler)["weight_precision"] == "int8"
    learner = settings.learner
    assert learner is not None and learner.sampler_precision == "int8"
    blockers = bypass_blockers(learner, Precision.from_settings(learner.train))
    assert "sampler.weight_precision=int8 (quantized weights)" in blockers
    # bfloat16 is a dtype: the learner sees it as the sampler's compute dtype
    bf16 = resolve(_cfg("sampler.weight_precision=bfloat16")).learner
    assert bf16 is not None and bf16.sampler_dtype in (torch.bfloat16, torch.float32)
