"""Fixtures: the tiny random Llama behind the real hf sampler and the real ChatRenderer."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import anyio
import pytest

from agentrl.chat import ChatRenderer
from agentrl.samplers import Generation, Sampler, SamplingParams, create_sampler


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    """The tiny model gains nothing from intra-op threads; on a shared 2-core machine they
    spin against other processes and make decoding ~10x slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny() -> tuple[Any, Any]:
    from agentrl.models import load_model

    return load_model("tiny-llama")


@pytest.fixture
def sampler(tiny: tuple[Any, Any]) -> Iterator[Sampler]:
    s = create_sampler("hf", model=tiny, max_batch_size=64, seed=0)
    yield s
    anyio.run(s.close)


@pytest.fixture(scope="session")
def renderer(tiny: tuple[Any, Any]) -> ChatRenderer:
    return ChatRenderer(tiny[1], tools=[])


class RecordingSampler(Sampler):
    """Delegates to a real sampler and records every request and its generation."""

    backend = "recording"

    def __init__(self, inner: Sampler) -> None:
        self.inner = inner
        self.calls: list[tuple[list[int], SamplingParams, Generation]] = []
        self._waiters: list[tuple[int, anyio.Event]] = []

    async def wait_for_calls(self, n: int) -> None:
        """Return once `n` generations have been recorded (an event, not a guess of time)."""
        if len(self.calls) < n:
            event = anyio.Event()
            self._waiters.append((n, event))
            await event.wait()

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

    def stats(self) -> dict[str, float]:
        return self.inner.stats()

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        gen = await self.inner.generate(prompt_ids, params)
        self.calls.append((list(prompt_ids), params, gen))
        for n, event in self._waiters:
            if len(self.calls) >= n:
                event.set()
        return gen

    async def update_weights(self, weights: Any, version: int) -> None:
        await self.inner.update_weights(weights, version)
