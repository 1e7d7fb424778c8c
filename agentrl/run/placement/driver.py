"""The driver's side of a Ray run: what the orchestrator holds in place of local parts.

- :class:`RemoteLearner`: a :class:`~agentrl.learner.protocol.LearnerLike` over the learner
  actor (blocking calls, as the thread learner's are).
- :class:`RayWeightBus`: ``publish(version, weights)`` asks the learner actor to publish
  from its own process (the weights never pass through the driver), then tells the
  routers which version each replica holds.
- :class:`RemoteEngine`: ``run_task(task, index)`` on the rollout worker with the fewest
  groups in flight; a worker that dies has its group run again on another (counted).
- :class:`DriverSampler`: the orchestrator's ``sampler``: a router over the replicas
  (evaluation generates through it) whose ``stats()`` are the replicas' own plus the
  ``placement/*`` counters.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.errors import InfraError
from agentrl.run.placement.learner_process import LearnerError
from agentrl.run.placement.router import ReplicaRouter

log = logging.getLogger("agentrl.run.placement")


@dataclass(frozen=True)
class LearnerWeights:
    """Stands for the learner's current weights, which stay in the learner actor."""

    version: int


def learner_death(e: Exception, doing: str) -> Exception:
    """What to raise for `e` from a call to the learner actor: its death as one line (a
    LearnerError, as for the local learner process) instead of a Ray traceback; `e` itself
    for anything else."""
    if not ReplicaRouter.is_replica_failure(e):
        return e
    first = (str(e).strip().splitlines() or [""])[0]
    return LearnerError(
        f"the learner actor died while {doing} ({type(e).__name__}: {first}); the last "
        "checkpoint is intact: --resume the run from it (out of memory? try a smaller "
        "learner.micro_batch_size, or more memory for ray.learner)"
    )


class RemoteLearner:
    def __init__(self, ray: Any, handle: Any) -> None:
        self._ray = ray
        self.handle = handle
        info = ray.get(handle.describe.remote())
        self.version: int = info["version"]
        self.step_count = 0
        self.last_credit: Any = None  # the learner actor's StepCredit of the last step
        self.node = info["node"]
        self._closed = False

    def _get(self, ref: Any, doing: str) -> Any:
        try:
            return self._ray.get(ref)
        except Exception as e:
            raise learner_death(e, doing) from None

    def step(self, groups: Any) -> dict[str, float]:
        metrics, self.version, self.step_count, self.last_credit = self._get(
            self.handle.step.remote(list(groups)), f"training step {self.step_count + 1}"
        )
        return metrics

    def sampler_weights(self) -> None:
        return None  # the weights live in the learner actor: publish state_dict_for_sampler

    def state_dict_for_sampler(self, dtype: Any = None) -> Any:
        return LearnerWeights(self.version)

    def save_checkpoint(self, directory: str | Path) -> Path:
        ref = self.handle.save_checkpoint.remote(str(directory))
        return Path(self._get(ref, "writing a checkpoint"))

    def load_checkpoint(self, directory: str | Path) -> None:
        self.version, self.step_count = self._get(
            self.handle.load_checkpoint.remote(str(directory)), "loading a checkpoint"
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._ray.get(self.handle.close.remote(), timeout=30)
        except Exception as e:  # already dead: nothing left to close
            log.debug("learner actor close: %s", e)
        self._ray.kill(self.handle)


class DriverSampler(ReplicaRouter):
    """The replicas as one sampler, for the orchestrator and the evaluator."""

    backend = "ray"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.placement_counters: dict[str, float] = {}

    def stats(self) -> dict[str, float]:
        out = super().stats()
        out.update({f"placement/{k}": v for k, v in self.placement_counters.items()})
        return out


class RayWeightBus:
    def __init__(
        self,
        learner: RemoteLearner,
        sampler: DriverSampler,
        samplers: list[Any],
        workers: list[Any],
        engine: RemoteEngine,
    ) -> None:
        self.learner = learner
        self.sampler = sampler
        self.samplers = samplers
        self._lost_seen = [0] * len(workers)  # requests_lost per worker, this life
        self._lost_before = [0] * len(workers)  # ... and its earlier lives
        self.workers = workers
        self.engine = engine
        self.version: int | None = None
        self.last: dict[str, Any] = {}

    async def publish(self, version: int, weights: Any) -> dict[str, Any]:
        if isinstance(weights, LearnerWeights) and weights.version != version:
            raise ValueError(f"publishing version {version} with weights of {weights.version}")
        try:
            report = await self.learner.handle.publish.remote()
        except Exception as e:
            raise learner_death(e, f"publishing version {version}") from None
        held: list[int | None] = report["held"]
        self.version = version
        self.last = report
        self.sampler.set_versions(held)
        self.engine.versions = held  # a worker Ray restarts later gets them from its probe
        told = await asyncio.gather(
            *(w.set_versions.remote(held) for w in self.workers), return_exceptions=True
        )
        for i, result in enumerate(told):
            if isinstance(result, BaseException):
                if not ReplicaRouter.is_replica_failure(result):
                    raise result
                log.warning(
                    "rollout worker %d is restarting; it gets version %s when back", i, version
                )
        await self._refresh_stats(report)
        return report

    async def _refresh_stats(self, report: dict[str, Any]) -> None:
        """Once per step: the replicas' sampler counters and the placement counters."""

        async def quiet(ref: Any) -> Any:
            try:
                return await ref
            except Exception:  # a replica restarting: its numbers come next step
                return None

        stats = await asyncio.gather(*(quiet(s.stats.remote()) for s in self.samplers))
        for i, s in enumerate(stats):
            if s is not None:
                self.sampler._stats[i] = s
        states = await asyncio.gather(*(quiet(w.router_state.remote()) for w in self.workers))
        # each worker's router counts since its (re)start: a count that went down belongs to
        # a restarted worker, and what its previous life counted stays in the total
        for i, state in enumerate(states):
            if state is None:  # restarting: its last count stands
                continue
            count = state["counters"]["requests_lost"]
            if count < self._lost_seen[i]:
                self._lost_before[i] += self._lost_seen[i]
            self._lost_seen[i] = count
        lost = sum(self._lost_before) + sum(self._lost_seen)
        self.sampler.placement_counters = {
            "sampler_requests_lost": float(lost),
            "groups_redispatched": float(self.engine.counters["groups_redispatched"]),
            "rollout_workers_lost": float(self.engine.counters["workers_lost"]),
            "weights_missed": float(report["missed"]),
            "publish_seconds": float(report["seconds"]),
        }


@dataclass
class _Runner:
    renderer: Any  # what Run.renderer reads (engine.runner.renderer)


class RemoteEngine:
    """Groups run on rollout worker actors (least groups in flight first).

    A worker that dies mid-group is marked down and its group runs again on another live
    worker (counted in ``groups_redispatched``); a background probe marks it up again once
    Ray has restarted it. While every worker is down, groups wait for the first one back
    (up to `revive_timeout_s`)."""

    def __init__(
        self, workers: list[Any], renderer: Any, retries: int, revive_timeout_s: float = 120.0
    ) -> None:
        self.workers = workers
        self.runner = _Runner(renderer)
        self.retries = retries
        self.revive_timeout_s = revive_timeout_s
        self.outstanding = [0] * len(workers)
        self.down: set[int] = set()
        self._back: asyncio.Event | None = None  # set when a down worker answers again
        self._probes: set[asyncio.Task[None]] = set()
        self.counters = {"groups_redispatched": 0, "workers_lost": 0}
        self.versions: list[int | None] | None = None  # what each sampler replica holds

    async def run_task(
        self, task: dict[str, Any], index: int = 0, group_id: str | None = None
    ) -> Any:
        failures: list[str] = []
        for _attempt in range(self.retries + 1):
            i = await self._pick(index, failures)
            self.outstanding[i] += 1
            try:
                return await self.workers[i].run_task.remote(task, index)
            except Exception as e:
                if not ReplicaRouter.is_replica_failure(e):
                    raise
                failures.append(f"worker {i}: {e}")
                self.counters["groups_redispatched"] += 1
                self._mark_down(i)
                log.warning("rollout worker %d died; task %d runs again (%s)", i, index, e)
            finally:
                self.outstanding[i] -= 1
        raise InfraError(
            f"task {index}: every attempt lost its rollout worker ({'; '.join(failures)}); "
            "raise ray.max_restarts or check the workers' logs"
        )

    async def _pick(self, index: int, failures: list[str]) -> int:
        """The live worker with the fewest groups in flight; waits while all are down."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.revive_timeout_s
        while True:
            live = [k for k in range(len(self.workers)) if k not in self.down]
            if live:
                return min(live, key=lambda k: (self.outstanding[k], k))
            if self._back is None:
                self._back = asyncio.Event()
            left = deadline - loop.time()
            try:
                await asyncio.wait_for(self._back.wait(), timeout=max(left, 0.0))
            except TimeoutError:
                raise InfraError(
                    f"task {index}: every rollout worker ({len(self.workers)}) has been down "
                    f"for {self.revive_timeout_s:g} s ({'; '.join(failures) or 'no answer'}); "
                    "raise ray.max_restarts or check the workers' logs"
                ) from None

    def _mark_down(self, i: int) -> None:
        if i in self.down:
            return
        self.down.add(i)
        self.counters["workers_lost"] += 1
        probe = asyncio.get_running_loop().create_task(self._probe(i))
        self._probes.add(probe)
        probe.add_done_callback(self._probes.discard)

    async def _probe(self, i: int) -> None:
        """Marks worker `i` up once Ray has restarted it (it stays down if Ray gave up)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.revive_timeout_s
        while loop.time() < deadline:
            try:
                await self.workers[i].describe.remote()
                if self.versions is not None:  # what was published while it was down
                    await self.workers[i].set_versions.remote(self.versions)
            except Exception as e:
                if not ReplicaRouter.is_replica_failure(e):
                    raise
                await asyncio.sleep(0.2)  # restarting
                continue
            self.down.discard(i)
            log.info("rollout worker %d is back", i)
            if self._back is not None:
                self._back.set()
                self._back = None
            return
