"""ReplicaRouter without Ray: two real tiny-model samplers as replicas."""

from __future__ import annotations

import anyio
import pytest

from agentrl.errors import InfraError
from agentrl.models import load_model
from agentrl.run.placement.router import ReplicaLost, ReplicaRouter
from agentrl.samplers import create_sampler
from agentrl.samplers.base import SamplingParams

PARAMS = SamplingParams(max_new_tokens=3, temperature=1.0)


class Dies:
    """A replica whose process is gone (what a dead Ray actor raises, by name)."""

    async def generate(self, prompt_ids, params):
        raise type("ActorDiedError", (RuntimeError,), {})("the actor died")


@pytest.fixture
def samplers():
    made = [create_sampler("hf", model=load_model("tiny-llama", dtype="float32")) for _ in range(2)]
    yield made
    for s in made:
        anyio.run(s.close)


def _router(replicas, **kw):
    tok = getattr(replicas[0], "tokenizer", None)
    return ReplicaRouter(replicas, tokenizer=tok, context_length=128, vocab_size=49152, **kw)


def test_episodes_stick_and_load_spreads(samplers):
    router = _router(samplers)
    picks: dict[int, list[int]] = {}

    async def episode(e: int) -> None:
        for turn in range(3):  # one task = one episode: every turn on the same replica
            await router.generate([1, 2, 3 + e, turn], PARAMS)
            picks.setdefault(e, []).append(router._sticky[anyio_task()])

    def anyio_task():
        import asyncio

        return asyncio.current_task()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for e in range(6):
                tg.start_soon(episode, e)

    anyio.run(main)
    assert all(len(set(p)) == 1 for p in picks.values()), picks
    assert sorted(set(p[0] for p in picks.values())) == [0, 1]  # both replicas used
    assert router.counters["sticky_hits"] >= 6
    assert router.outstanding == [0, 0]


def test_a_dead_replica_is_an_infra_error_and_skipped(samplers):
    router = _router([Dies(), samplers[0]])

    async def main() -> None:
        router.outstanding[1] = 5  # the dead one looks least busy
        with pytest.raises(ReplicaLost) as err:
            await router.generate([1, 2, 3], PARAMS)
        assert isinstance(err.value, InfraError)  # the episode retries or masks it
        router.outstanding[1] = 0
        gen = await router.generate([1, 2, 3], PARAMS)
        assert len(gen.token_ids) >= 1

    anyio.run(main)
    assert router.down == {0}
    assert router.counters["requests_lost"] == 1
    router.set_versions([0, 0])  # a later publish reached it: back in rotation
    assert router.down == set()


def test_a_replica_behind_the_newest_version_is_skipped(samplers):
    router = _router(samplers, versions=[3, 2])
    assert router.pick() == 0
    router.outstanding[0] = 100
    assert router.pick() == 0  # the stale one is never preferred, however idle
    assert router.version == 2  # the oldest weights a new token may carry
