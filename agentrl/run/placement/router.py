"""One Sampler over several replicas: least outstanding work, episodes kept on one replica.

    router = ReplicaRouter(replicas, tokenizer=tok, context_length=2048, vocab_size=49152)
    gen = await router.generate(prompt_ids, params)   # any RolloutEngine takes it as its sampler

A replica is anything with ``async generate(prompt_ids, params) -> Generation`` (a Ray
actor's client, or a plain in-process sampler in tests): the router knows nothing of Ray.
Requests go to the live, up-to-date replica with the fewest requests in flight. The
generations of one episode (one asyncio task: every turn of an episode is generated from
its task) stay on the replica that served its first turn while that replica's prefix
cache holds its context, unless it has ``sticky_slack`` more requests in flight than the
least busy one. A replica whose weights are older than the newest version seen is used
only when no current one is free (a restarted replica until the next publish reaches it).
A replica that fails is marked down (its requests raise :class:`InfraError`, so the
episode is retried or masked, never silently lost) until :meth:`replica_up` says it is back.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from typing import Any

from agentrl.errors import InfraError
from agentrl.samplers.base import Generation, Sampler, SamplingParams


class ReplicaLost(InfraError):
    """A sampler replica died while serving a request (the episode is an infra failure)."""


class ReplicaRouter(Sampler):
    backend = "replicas"

    def __init__(
        self,
        replicas: Sequence[Any],
        *,
        tokenizer: Any,
        context_length: int | None,
        vocab_size: int,
        versions: Sequence[int] | None = None,
        sticky_slack: int = 8,
    ) -> None:
        if not replicas:
            raise ValueError("a ReplicaRouter needs at least one replica")
        self.replicas = list(replicas)
        self._tokenizer = tokenizer
        self._context_length = context_length
        self._vocab_size = vocab_size
        self.sticky_slack = sticky_slack
        n = len(self.replicas)
        self.versions = list(versions) if versions is not None else [0] * n
        self.outstanding = [0] * n
        self.down: set[int] = set()
        self._sticky: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = (
            weakref.WeakKeyDictionary()
        )
        self._stats = [dict[str, float]() for _ in range(n)]
        self.counters = {"requests": 0, "sticky_hits": 0, "requests_lost": 0, "replicas_lost": 0}
        self.served = [0] * n

    # --- the Sampler contract --------------------------------------------------------

    @property
    def version(self) -> int:
        """The oldest version among live replicas (what a new token may still carry)."""
        live = [v for i, v in enumerate(self.versions) if i not in self.down]
        return min(live or self.versions)

    @property
    def context_length(self) -> int | None:
        return self._context_length

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def stats(self) -> dict[str, float]:
        """The replicas' counters summed, and the router's own under ``router/``."""
        out: dict[str, float] = {}
        for s in self._stats:
            for k, v in s.items():
                out[k] = out.get(k, 0.0) + v
        out.update({f"router/{k}": float(v) for k, v in self.counters.items()})
        return out

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        task = asyncio.current_task()
        i = self.pick(task)
        if task is not None:
            self._sticky[task] = i
        self.outstanding[i] += 1
        self.served[i] += 1
        self.counters["requests"] += 1
        try:
            result = await self.replicas[i].generate(list(prompt_ids), params)
        except InfraError:
            raise
        except Exception as e:
            if not self.is_replica_failure(e):
                raise
            self.mark_down(i)
            self.counters["requests_lost"] += 1
            raise ReplicaLost(f"sampler replica {i} failed mid-request: {e}") from None
        finally:
            self.outstanding[i] -= 1
        generation, stats = result if isinstance(result, tuple) else (result, None)
        if stats is not None:
            self._stats[i] = stats
        if generation.versions:
            self.versions[i] = max(self.versions[i], generation.versions[-1])
        return generation

    async def update_weights(self, weights: Any, version: int) -> None:
        raise NotImplementedError(
            "a ReplicaRouter does not take weights: the weight bus delivers to each replica"
        )

    # --- routing ---------------------------------------------------------------------

    def pick(self, task: Any = None) -> int:
        """The replica for the next request of `task` (see the module doc)."""
        live = [i for i in range(len(self.replicas)) if i not in self.down]
        if not live:
            raise ReplicaLost(
                f"every sampler replica ({len(self.replicas)}) is down; Ray restarts them "
                "up to ray.max_restarts times"
            )
        newest = max(self.versions[i] for i in live)
        current = [i for i in live if self.versions[i] == newest]
        least = min(current, key=lambda i: self.outstanding[i])
        sticky = self._sticky.get(task) if task is not None else None
        if (
            sticky is not None
            and sticky in current
            and self.outstanding[sticky] <= self.outstanding[least] + self.sticky_slack
        ):
            self.counters["sticky_hits"] += 1
            return sticky
        return least

    def mark_down(self, i: int) -> None:
        if i not in self.down:
            self.down.add(i)
            self.counters["replicas_lost"] += 1

    def replica_up(self, i: int, version: int) -> None:
        """Replica `i` answers again (restarted) with weights of `version`."""
        self.down.discard(i)
        self.versions[i] = version

    def set_versions(self, versions: Sequence[int | None]) -> None:
        """Versions the weight bus just delivered (None: that replica missed the publish)."""
        for i, v in enumerate(versions):
            if v is not None:
                self.versions[i] = v
                self.down.discard(i)

    @staticmethod
    def is_replica_failure(e: BaseException) -> bool:
        """A failure of the replica's process (not of the request)."""
        names = {c.__name__ for c in type(e).__mro__}
        return bool(
            names & {"RayActorError", "ActorDiedError", "ActorUnavailableError", "ConnectionError"}
        )
