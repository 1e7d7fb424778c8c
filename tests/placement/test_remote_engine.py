"""RemoteEngine without Ray: workers whose process dies mid-group and comes back."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from agentrl.errors import InfraError
from agentrl.run.placement.driver import RemoteEngine
from tests.waiting import wait_until_async

ActorDied = type("ActorDiedError", (RuntimeError,), {})  # what Ray raises, by name
Restarting = type("ActorUnavailableError", (RuntimeError,), {})


class _Method:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)


class Worker:
    """Runs groups; `die_on` task indices kill its process, which then answers "restarting"
    `down_answers` times (None: until `come_back()`, inf: for good)."""

    def __init__(
        self, name: str, die_on: set[int] = frozenset(), down_answers: float | None = 0
    ) -> None:
        self.name, self.die_on, self.down_answers = name, set(die_on), down_answers
        self.ran: list[int] = []
        self.down = False
        self.restarting_answers = 0  # "restarting" said since the last death
        self.versions = None
        self.run_task = _Method(self._run_task)
        self.describe = _Method(self._describe)
        self.set_versions = _Method(self._set_versions)

    def come_back(self) -> None:
        self.down_answers = self.restarting_answers

    def _check(self) -> None:
        if self.down:
            if self.down_answers is None or self.restarting_answers < self.down_answers:
                self.restarting_answers += 1
                raise Restarting("the actor is restarting")
            self.down = False

    async def _run_task(self, task, index):
        self._check()
        await asyncio.sleep(0)  # a yield to the loop, as a remote call has
        if index in self.die_on:
            self.die_on.discard(index)
            self.down, self.restarting_answers = True, 0
            raise ActorDied("the actor died unexpectedly")
        self.ran.append(index)
        return f"{self.name}:{index}"

    async def _describe(self):
        self._check()
        return {}

    async def _set_versions(self, versions):
        self._check()
        self.versions = versions


def test_a_dead_workers_group_runs_on_another_and_the_worker_comes_back():
    a, b = Worker("a", die_on={0}, down_answers=None), Worker("b")
    engine = RemoteEngine([a, b], renderer=None, retries=1)
    engine.versions = [3]

    async def main():
        first = await engine.run_task({}, index=0)  # a dies: the group runs again on b
        assert first == "b:0" and engine.down == {0}
        assert await engine.run_task({}, index=1) == "b:1"  # a is down: not picked
        await wait_until_async(lambda: a.restarting_answers >= 2, "the probe asking a twice")
        assert engine.down == {0}  # still restarting: still down
        a.come_back()
        await wait_until_async(lambda: not engine.down, "the probe seeing a answer again")
        assert a.versions == [3]  # told what was published while it was down
        return await engine.run_task({}, index=2)

    assert anyio.run(main) == "a:2"
    assert engine.counters == {"groups_redispatched": 1, "workers_lost": 1}


def test_groups_wait_while_every_worker_restarts():
    a = Worker("a", die_on={0}, down_answers=2)
    engine = RemoteEngine([a], renderer=None, retries=1)
    assert anyio.run(engine.run_task, {}, 0) == "a:0"  # the second attempt waited for a
    assert engine.counters["groups_redispatched"] == 1
    assert a.restarting_answers == 2  # it waited through both "restarting" answers


def test_a_worker_that_never_comes_back_is_an_infra_error_naming_the_setting():
    a = Worker("a", die_on={0}, down_answers=float("inf"))
    engine = RemoteEngine([a], renderer=None, retries=1, revive_timeout_s=0.3)
    with pytest.raises(
        InfraError, match=r"every rollout worker \(1\) has been down .*max_restarts"
    ):
        anyio.run(engine.run_task, {}, 0)
