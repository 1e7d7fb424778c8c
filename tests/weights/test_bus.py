"""WeightBus: one publish reaches every sampler, through each sampler's transport."""

from __future__ import annotations

import pytest
import torch

from agentrl.errors import WeightUpdateError
from agentrl.models import load_model
from agentrl.samplers import SamplingParams
from agentrl.samplers.hf import HFSampler
from agentrl.weights import SafetensorsDirTransport, WeightBus

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def trained_copy(seed: int = 5):
    """A 'learner' model: tiny-llama with different weights."""
    learner, _ = load_model("tiny-llama")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in learner.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return learner


async def test_publish_reaches_every_sampler_through_its_transport(tmp_path):
    learner = trained_copy()
    in_process = HFSampler(*load_model("tiny-llama"))
    from_folder = HFSampler(*load_model("tiny-llama"))
    from_folder.weight_payload = "safetensors_dir"  # reloads from a safetensors folder
    transport = SafetensorsDirTransport(tmp_path)
    bus = WeightBus(transports={"safetensors_dir": transport})
    bus.register(in_process)
    bus.register(from_folder)

    report = await bus.publish(1, learner)
    assert in_process.version == from_folder.version == bus.version == 1
    assert set(report.prepare_s) == {"state_dict", "safetensors_dir"}
    assert len(report.deliver_s) == 2 and report.total_s > 0
    assert report.bytes == sum(p.numel() * p.element_size() for p in learner.parameters())
    assert (tmp_path / "v1" / "model.safetensors").exists()

    prompt = [1, 9690, 198, 2683, 359]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    expected = learner.generate(
        torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0
    )[0, len(prompt) :].tolist()
    for sampler in (in_process, from_folder):
        gen = await sampler.generate(prompt, greedy.with_(stop_token_ids=()))
        assert gen.versions == [1] * len(gen.token_ids)
        assert gen.token_ids == expected[: len(gen.token_ids)]

    # the next version replaces the folder of the old one
    await bus.publish(2, trained_copy(seed=6).state_dict())
    assert (tmp_path / "v2").exists() and not (tmp_path / "v1").exists()
    assert in_process.version == from_folder.version == 2

    with pytest.raises(WeightUpdateError, match="only go up"):
        await bus.publish(2, learner)
    for sampler in (in_process, from_folder):
        await sampler.close()


async def test_a_failing_sampler_is_named_and_the_others_still_update():
    good = HFSampler(*load_model("tiny-llama"))
    from transformers import LlamaForCausalLM

    tiny, tokenizer = load_model("tiny-llama")
    deeper = LlamaForCausalLM(
        tiny.config.__class__(**{**tiny.config.to_dict(), "num_hidden_layers": 3})
    )
    bad = HFSampler(deeper, tokenizer)  # a different architecture: one more layer
    bus = WeightBus()
    bus.register(good)
    bus.register(bad)
    weights = trained_copy().state_dict()
    with pytest.raises(
        WeightUpdateError, match=r"hf#1: WeightUpdateError.*missing keys \[model\.layers\.2\."
    ):
        await bus.publish(1, weights)
    assert good.version == 1 and bad.version == 0
    await good.close()
    await bad.close()
