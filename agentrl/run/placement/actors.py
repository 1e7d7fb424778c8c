"""Thin actor shells: each builds one of the ordinary classes and forwards calls to it.

The classes (a Sampler from :func:`agentrl.run.components.build_sampler`, a RolloutEngine from
:func:`agentrl.run.components.build_engine`, a Learner from :func:`agentrl.run.components.load_learner`)
do not know Ray; these shells are what Ray places (``ray.remote(SamplerShell)``), and a
test can construct any shell in-process without Ray. Every shell owns one
:class:`~agentrl.resources.ResourceScope` closed by :meth:`close`, and applies the run's
process settings (seed, allocator) with torch threads sized to the CPUs Ray gave it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio

from agentrl.config import Config
from agentrl.learner.distributed import set_collective_timeout
from agentrl.models import load_tokenizer
from agentrl.resources import ResourceScope
from agentrl.run.components import build_engine, build_env, build_sampler, load_learner
from agentrl.run.placement.learner_process import (
    ATTRIBUTE_S,
    Fault,
    LearnerError,
    join_learner_group,
    report_phases,
    timed_out,
)
from agentrl.run.placement.router import ReplicaRouter
from agentrl.run.process_settings import apply_process_settings
from agentrl.run.settings import learner_settings, sampler_settings
from agentrl.samplers.base import Generation, SamplingParams
from agentrl.weights import WeightBus
from agentrl.weights.broadcast import BroadcastPayload, BroadcastReceiver, BroadcastTransport

log = logging.getLogger("agentrl.run.placement")


def _process_settings(cfg: Config, num_cpus: float) -> None:
    import torch

    apply_process_settings(cfg)
    threads = cfg.orchestrator.cpu_threads or max(1, int(num_cpus))
    torch.set_num_threads(threads)


def _node() -> str:
    try:
        import ray

        return ray.get_runtime_context().get_node_id()
    except Exception:  # constructed without Ray (tests)
        return "local"


class SamplerShell:
    """One sampler replica."""

    def __init__(self, cfg: Config, index: int) -> None:
        _process_settings(cfg, cfg.ray.samplers.num_cpus)
        self.index = index
        settings = sampler_settings(cfg)  # resolved in this actor, on its node
        self.sampler = build_sampler(settings)
        self._incarnation = uuid.uuid4().hex  # new after every restart
        self._device = settings.device if settings.backend == "hf" else "cpu"
        self._receiver: Any = None

    async def describe(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "node": _node(),
            "pid": os.getpid(),
            "incarnation": self._incarnation,
            "version": self.sampler.version,
            "context_length": self.sampler.context_length,
            "vocab_size": self.sampler.vocab_size,
        }

    async def incarnation(self) -> str:
        return self._incarnation

    async def version(self) -> int:
        return self.sampler.version

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams
    ) -> tuple[Generation, dict[str, float]]:
        generation = await self.sampler.generate(prompt_ids, params)
        return generation, self.sampler.stats()

    async def update_weights(self, payload: Any, version: int) -> int:
        """Swap to `version` from whatever the transport sent; returns the version now held."""
        from agentrl.weights.ray_object_store import ObjectStoreWeights

        if isinstance(payload, ObjectStoreWeights):
            state: Any = await payload.fetch()
        elif isinstance(payload, BroadcastPayload):
            if self._receiver is None:
                raise RuntimeError("weight broadcast before this replica joined a group")
            state = await anyio.to_thread.run_sync(self._receiver.receive, payload.layout)
        else:
            state = payload  # a state dict or a folder, as in one process
        if version > self.sampler.version:
            await self.sampler.update_weights(state, version)
        return self.sampler.version

    async def join_group(self, address: Any) -> None:
        device = "cuda" if address.backend == "nccl" else "cpu"
        if self._receiver is None or self._receiver.device != device:
            self._receiver = BroadcastReceiver(device)
        await anyio.to_thread.run_sync(self._receiver.join, address)

    async def stats(self) -> dict[str, float]:
        return self.sampler.stats()

    async def close(self) -> None:
        await self.sampler.close()


class RolloutWorkerShell:
    """Runs episodes on its node: its own environment (and sandboxes), an engine whose
    sampler is a :class:`~agentrl.run.placement.router.ReplicaRouter` over the replicas."""

    def __init__(self, cfg: Config, index: int, replicas: list[Any]) -> None:
        import ray

        _process_settings(cfg, cfg.ray.rollout_workers.num_cpus)
        self.index = index
        self.scope = ResourceScope(f"rollout-worker-{index}")
        self.env = build_env(cfg)
        tokenizer = load_tokenizer(cfg.model.name)
        info = ray.get(replicas[0].describe.remote())  # started with us: they boot together
        self.router = ReplicaRouter(
            [ActorReplica(r) for r in replicas],
            tokenizer=tokenizer,
            context_length=info["context_length"],
            vocab_size=info["vocab_size"],
            versions=[info["version"]] * len(replicas),
            sticky_slack=cfg.ray.sticky_slack,
        )
        self.engine = build_engine(cfg, self.env, self.router)

    async def describe(self) -> dict[str, Any]:
        return {"index": self.index, "node": _node(), "pid": os.getpid()}

    async def run_task(self, task: dict[str, Any], index: int) -> Any:
        with self.scope.active():  # tools open their sandboxes in this worker's scope
            return await self.engine.run_task(task, index=index)

    async def set_versions(self, versions: list[int | None]) -> None:
        self.router.set_versions(versions)

    async def router_state(self) -> dict[str, Any]:
        r = self.router
        return {"served": list(r.served), "counters": dict(r.counters), "versions": r.versions}

    async def close(self) -> None:
        await self.scope.aclose()


class ActorReplica:
    """A sampler actor as the router sees it: ``generate`` that awaits the actor."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Any:
        return await self.handle.generate.remote(prompt_ids, params)


class ReplicaClient:
    """A sampler replica as the learner's WeightBus sees it (a Sampler for the bus)."""

    backend = "ray-replica"

    def __init__(self, handle: Any, transport: str) -> None:
        self.handle = handle
        self.weight_payload = transport  # the bus prepares this transport's payload for it
        self.held: int | None = None  # version it holds, None after a missed publish
        self.missed = 0

    async def update_weights(self, payload: Any, version: int) -> None:
        try:
            self.held = await self.handle.update_weights.remote(payload, version)
        except Exception as e:
            if not ReplicaRouter.is_replica_failure(e):
                raise
            # dead or restarting: it is skipped by the routers until a later publish
            self.held, self.missed = None, self.missed + 1
            log.warning("sampler replica missed weights v%d: %s", version, e)

    async def join_group(self, address: Any) -> None:
        await self.handle.join_group.remote(address)

    async def incarnation(self) -> str:
        return await self.handle.incarnation.remote()


class LearnerShell:
    """The learner, and the weight bus that publishes from its process to the replicas.

    An async actor: ``publish`` awaits the replicas; the blocking calls (``step``,
    checkpoints) hold the actor's loop, which is what they mean (one step at a time)."""

    def __init__(self, cfg: Config, peers: Sequence[Any] = (), address: str = "") -> None:
        _process_settings(cfg, cfg.ray.learner.num_cpus)
        self.cfg = cfg
        # learner.world_size > 1: this actor is rank 0; `peers` (LearnerRankShell actors,
        # ranks 1..n-1) join the group at `address` as this one starts, and follow each
        # request; the weights are gathered once per version, here
        self.peers = list(peers)
        settings = learner_settings(cfg)  # resolved in this actor, on its node
        if self.peers:
            join_learner_group(settings, 0, address, local_rank=0)
        self.learner = load_learner(settings)
        self._whole: dict[str, Any] | None = None
        if self.peers:
            self._whole = self.learner.gathered_sampler_weights()
            set_collective_timeout(float(cfg.learner.collective_timeout_s))
        self.replicas: list[ReplicaClient] = []
        self.bus: Any = None
        self._transport: Any = None

    async def describe(self) -> dict[str, Any]:
        return {"node": _node(), "pid": os.getpid(), "version": self.learner.version}

    def connect_replicas(self, handles: list[Any]) -> None:
        kind = self.cfg.ray.weight_transport
        transports: dict[str, Any] = {}
        if kind == "object_store":
            import agentrl.weights.ray_object_store  # noqa: F401 - registers the transport

            name = "ray_object_store"
        else:
            name = kind
            self._transport = BroadcastTransport(kind, lambda: self.replicas)
            transports[name] = self._transport
        self.replicas = [ReplicaClient(h, name) for h in handles]
        self.bus = WeightBus(transports)
        for client in self.replicas:
            self.bus.register(client)

    def step(self, groups: list[Any]) -> tuple[dict[str, float], int, int, Any]:
        follow = [p.step.remote(groups) for p in self.peers]
        with self._led(follow, "training a step"):
            metrics = self.learner.step(groups)
            if self.peers:
                self._whole = self.learner.gathered_sampler_weights()
        _followed(follow, "training a step")
        return metrics, self.learner.version, self.learner.step_count, self.learner.last_credit

    @contextlib.contextmanager
    def _led(self, follow: list[Any], doing: str) -> Iterator[None]:
        """Rank 0's share of a request the peers follow. When it fails, a peer's death or
        failure is the cause if one shows within ATTRIBUTE_S (a dead peer fails rank 0's
        collective as its sockets close); a collective that timed out is said so."""
        try:
            yield
        except Exception as e:
            if follow:
                import ray

                ready, _ = ray.wait(follow, num_returns=len(follow), timeout=ATTRIBUTE_S)
                for rank, ref in enumerate(follow, start=1):
                    if ref in ready:
                        try:
                            ray.get(ref)
                        except ray.exceptions.RayActorError as dead:
                            raise LearnerError(_died(rank, doing, dead)) from None
                        except Exception:  # failed after rank 0 (a collective it left)
                            pass
                if timed_out(e):
                    raise LearnerError(
                        f"learner rank 0 waited {self.cfg.learner.collective_timeout_s:g} s "
                        "(learner.collective_timeout_s) for the other ranks in a collective "
                        f"while {doing}; the last checkpoint is intact"
                    ) from e
            raise

    async def publish(self) -> dict[str, Any]:
        """Publish the current weights to every replica; returns what each one holds."""
        version = self.learner.version
        if self._whole is not None:  # gathered after the step: a copy the next step keeps
            weights = {k: v.detach().clone() for k, v in self._whole.items()}
        else:
            weights = self.learner.state_dict_for_sampler()
        report = await self.bus.publish(version, weights)
        return {
            "version": version,
            "held": [c.held for c in self.replicas],
            "missed": sum(c.missed for c in self.replicas),
            "seconds": report.total_s,
            "bytes": report.bytes,
            "prepare_s": report.prepare_s,
        }

    def save_checkpoint(self, directory: str) -> str:
        follow = [p.save_checkpoint.remote(directory) for p in self.peers]
        with self._led(follow, "saving a checkpoint"):
            saved = str(self.learner.save_checkpoint(Path(directory)))
        _followed(follow, "saving a checkpoint")
        return saved

    def load_checkpoint(self, directory: str) -> tuple[int, int]:
        follow = [p.load_checkpoint.remote(directory) for p in self.peers]
        with self._led(follow, "loading a checkpoint"):
            self.learner.load_checkpoint(Path(directory))
            if self.peers:
                self._whole = self.learner.gathered_sampler_weights()
        _followed(follow, "loading a checkpoint")
        return self.learner.version, self.learner.step_count

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
        self.learner.close()


class LearnerRankShell:
    """Rank `rank` (> 0) of the learner group in a Ray actor (``learner.world_size > 1``):
    it joins rank 0's group, and runs each request rank 0 forwards at the same time, so
    the collectives meet (see :mod:`agentrl.learner.distributed`)."""

    def __init__(self, cfg: Config, rank: int, address: str, fault: Fault | None = None) -> None:
        _process_settings(cfg, cfg.ray.learner.num_cpus)
        self.rank = rank
        settings = learner_settings(cfg)  # resolved in this actor, on its node
        join_learner_group(settings, rank, address, local_rank=0)
        self.learner = load_learner(settings)
        self.learner.gathered_sampler_weights()  # rank 0 gathers the first version now
        set_collective_timeout(float(cfg.learner.collective_timeout_s))
        report_phases(self.learner, rank, fault=fault)  # a drill's fault, where it names this rank

    def step(self, groups: list[Any]) -> None:
        self.learner.step(groups)
        self.learner.gathered_sampler_weights()

    def save_checkpoint(self, directory: str) -> None:
        self.learner.save_checkpoint(Path(directory))

    def load_checkpoint(self, directory: str) -> None:
        self.learner.load_checkpoint(Path(directory))
        self.learner.gathered_sampler_weights()


def _died(rank: int, doing: str, e: Exception) -> str:
    return (
        f"learner rank {rank} died while {doing} ({type(e).__name__}); the last checkpoint "
        "is intact"
    )


def _followed(refs: list[Any], doing: str) -> None:
    """Wait for the peer ranks' share of a request; a dead or failed rank is named."""
    import ray

    for rank, ref in enumerate(refs, start=1):
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError as e:
            raise LearnerError(_died(rank, doing, e)) from None
        except ray.exceptions.RayTaskError as e:
            raise LearnerError(f"learner rank {rank} failed while {doing}: {e}") from None
