"""Fixtures: the tiny random Llama behind the real hf sampler, and a gateway serving it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest

from agentrl.envs.program import ModelEndpoint
from agentrl.gateway import Gateway, GatewayServer, GatewaySettings
from agentrl.samplers import Generation, Sampler, SamplingParams, create_sampler


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny() -> tuple[Any, Any]:
    from agentrl.models import load_model

    return load_model("tiny-llama", dtype="float32")


class RecordingSampler(Sampler):
    """Delegates to a real sampler and keeps every prompt and generation it served."""

    backend = "recording"

    def __init__(self, inner: Sampler) -> None:
        self.inner = inner
        self.calls: list[tuple[list[int], Generation]] = []

    @property
    def version(self) -> int:
        return self.inner.version

    @property
    def tokenizer(self) -> Any:
        return self.inner.tokenizer

    @property
    def context_length(self) -> int | None:
        return self.inner.context_length

    @property
    def vocab_size(self) -> int:
        return self.inner.vocab_size

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        gen = await self.inner.generate(prompt_ids, params)
        self.calls.append((list(prompt_ids), gen))
        return gen

    async def update_weights(self, weights: Any, version: int) -> None:
        await self.inner.update_weights(weights, version)

    async def close(self) -> None:
        await self.inner.close()


class ScriptedSampler(RecordingSampler):
    """Answers with fixed texts in turn (a model that knows the tool format), as token ids
    of the real tokenizer with their versions; what the gateway does with them is real."""

    backend = "scripted"

    def __init__(self, inner: Sampler, replies: Sequence[str]) -> None:
        super().__init__(inner)
        self.replies = list(replies)

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        text = self.replies[len(self.calls) % len(self.replies)]
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        n = len(ids)
        gen = Generation(ids, [-0.5] * n, [self.version] * n, "stop", text=text)
        self.calls.append((list(prompt_ids), gen))
        return gen


@pytest.fixture
async def hf_sampler(tiny: tuple[Any, Any]) -> AsyncIterator[RecordingSampler]:
    # the sampler computes on the session's tiny model itself: a test that publishes
    # weights changes them for every later test, so they are put back afterwards
    weights = {k: v.clone() for k, v in tiny[0].state_dict().items()}
    sampler = RecordingSampler(create_sampler("hf", model=tiny, max_batch_size=64, seed=0))
    yield sampler
    await sampler.close()
    tiny[0].load_state_dict(weights)


async def start_gateway(sampler: Sampler, **settings: Any) -> GatewayServer:
    server = GatewayServer(Gateway(sampler, GatewaySettings(**{"max_new_tokens": 8, **settings})))
    await server.start()
    return server


@pytest.fixture
async def gateway(hf_sampler: RecordingSampler) -> AsyncIterator[Gateway]:
    server = await start_gateway(hf_sampler)
    yield server.gateway
    await server.close()


def session_endpoint(gateway: Gateway, session: Any) -> ModelEndpoint:
    """What the run layer hands an agent program for `session`: its URL, key and one
    openai.AsyncOpenAI on it (``await endpoint.client().close()`` when done)."""
    import openai

    url = gateway.session_url(session)
    client = openai.AsyncOpenAI(base_url=url, api_key=session.key, max_retries=0)
    return ModelEndpoint(
        base_url=url,
        api_key=session.key,
        model=gateway.settings.model_names[0],
        timeout_s=60.0,
        make_client=lambda: client,
    )
