"""``orchestrator.backend: ray``: the run's parts as Ray actors, in the same Run.

    run = assemble_on_ray(cfg, "train")     # what agentrl.run.runtime.assemble returns for ray

Order (every check before any model loads): connect (``ray.address`` / ``RAY_ADDRESS`` or
a local instance), check the cluster has what every role asks for, place each role in a
placement group, import the environment on every rollout worker's node (a plug-in that is
missing there is one line naming ``env.name``), then start the learner (on the driver's
node: it writes the run's checkpoints), the sampler replicas and the rollout workers. The
Run's scope kills every actor, removes the placement groups and stops a local instance
when it closes, on every exit path.
"""

from __future__ import annotations

import logging
from typing import Any

import agentrl.run.placement.cluster as cluster
from agentrl.chat import ChatRenderer
from agentrl.config import Config
from agentrl.models import load_tokenizer, prepare_files
from agentrl.resources import ResourceScope
from agentrl.run.components import Run, build_env
from agentrl.run.placement.actors import (
    ActorReplica,
    LearnerRankShell,
    LearnerShell,
    RolloutWorkerShell,
    SamplerShell,
)
from agentrl.run.placement.driver import (
    DriverSampler,
    RayWeightBus,
    RemoteEngine,
    RemoteLearner,
)
from agentrl.run.placement.learner_process import Fault, drill_fault, free_port
from agentrl.run.placement.router import ReplicaRouter

log = logging.getLogger("agentrl.run.placement")


def _probe_env(cfg: Config) -> dict[str, str]:
    """Runs on a rollout worker's node: the environment builds there."""
    import os

    import ray

    build_env(cfg)
    return {"node": ray.get_runtime_context().get_node_id(), "pid": str(os.getpid())}


def _learner_ranks(
    conn: cluster.Connection,
    cfg: Config,
    options: dict[str, Any],
    timeout: float,
    fault: Fault | None = None,
) -> tuple[list[Any], str]:
    """Ranks 1..n-1 of a learner group (``learner.world_size: n``) as Ray actors in a
    placement group (one bundle of ``ray.learner`` each, ``ray.placement_strategy``), and
    the rendezvous address of rank 0, which runs on the driver's node (it writes the run's
    checkpoints). `fault`: a drill's, handed to the rank it names."""
    world = cfg.learner.world_size
    if world == 1:
        return [], ""
    ray = conn.ray
    address = f"tcp://{ray.util.get_node_ip_address()}:{free_port()}"
    pg = cluster.placement_group(conn, cfg, "learner", world - 1, timeout)
    rank_cls = ray.remote(LearnerRankShell)
    peers = [
        rank_cls.options(**options, max_concurrency=1, **cluster.scheduling(pg, r - 1)).remote(
            cfg, r, address, fault
        )
        for r in range(1, world)
    ]
    return peers, address


def assemble_on_ray(cfg: Config, role: str, **kwargs: Any) -> Run:
    """The training run's parts in Ray actors (rollout and eval run in one process: see
    :func:`agentrl.run.runtime.assemble`)."""
    if role != "train":
        raise ValueError(f"assemble_on_ray places training runs (got role={role!r})")
    conn = cluster.connect(cfg)
    scope = ResourceScope("run")
    actors: list[Any] = []
    learner: RemoteLearner | None = None
    ray = conn.ray
    rc = cfg.ray
    timeout = rc.start_timeout_s
    try:
        cluster.check_resources(cfg, ray)
        pg_samplers = cluster.placement_group(conn, cfg, "samplers", rc.samplers.replicas, timeout)
        pg_workers = cluster.placement_group(
            conn, cfg, "rollout_workers", rc.rollout_workers.replicas, timeout
        )
        # the environment (a plug-in) must import where the episodes run
        probe = ray.remote(num_cpus=0)(_probe_env)
        cluster.wait_started(
            ray,
            [
                probe.options(**cluster.scheduling(pg_workers, i)).remote(cfg)
                for i in range(rc.rollout_workers.replicas)
            ],
            f"env.name={cfg.env.name!r} on a rollout worker's node (install the plug-in "
            "on every node, or ship it with a Ray runtime_env)",
            timeout,
        )
        # models load from here on
        prepare_files(cfg.model.name)  # a conversion the model needs happens once, here

        def options(section: Any, **extra: Any) -> dict[str, Any]:
            return {
                "num_cpus": section.num_cpus,
                "num_gpus": section.num_gpus,
                "resources": dict(section.resources),
                **extra,
            }

        learner_cls = ray.remote(LearnerShell).options(
            **options(rc.learner, max_restarts=0, max_concurrency=1),
            **cluster.on_this_node(ray),
        )
        peers, address = _learner_ranks(
            conn, cfg, options(rc.learner, max_restarts=0), timeout, drill_fault()
        )
        actors.extend(peers)
        learner_handle = learner_cls.remote(cfg, peers, address)
        actors.append(learner_handle)
        sampler_cls = ray.remote(SamplerShell)
        samplers = []
        for i in range(rc.samplers.replicas):
            handle = sampler_cls.options(
                **options(rc.samplers, max_restarts=rc.max_restarts, max_concurrency=1000),
                **cluster.scheduling(pg_samplers, i),
            ).remote(cfg, i)
            samplers.append(handle)
            actors.append(handle)
        worker_cls = ray.remote(RolloutWorkerShell)
        workers = []
        for i in range(rc.rollout_workers.replicas):
            handle = worker_cls.options(
                **options(rc.rollout_workers, max_restarts=rc.max_restarts, max_concurrency=1000),
                **cluster.scheduling(pg_workers, i),
            ).remote(cfg, i, samplers)
            workers.append(handle)
            actors.append(handle)
        # every actor boots at once (imports and model loads overlap); then wait for each role
        infos = cluster.wait_started(
            ray,
            [s.describe.remote() for s in samplers],
            f"sampler replica (sampler.backend={cfg.sampler.backend})",
            timeout + 120,
        )
        info = infos[0]
        cluster.wait_started(
            ray, [w.describe.remote() for w in workers], "rollout worker", timeout + 60
        )
        cluster.wait_started(ray, [learner_handle.describe.remote()], "learner", timeout + 120)
        learner = RemoteLearner(ray, learner_handle)
        ray.get(learner_handle.connect_replicas.remote(samplers))

        tokenizer = load_tokenizer(cfg.model.name)
        sampler = DriverSampler(
            [ActorReplica(s) for s in samplers],
            tokenizer=tokenizer,
            context_length=info["context_length"],
            vocab_size=info["vocab_size"],
            versions=[i["version"] for i in infos],
            sticky_slack=rc.sticky_slack,
        )
        env = build_env(cfg)  # the driver's copy: the task list, never an episode
        renderer = ChatRenderer(
            tokenizer, tools=env.tool_schemas(), template=cfg.model.chat_template
        )
        engine = RemoteEngine(workers, renderer, retries=max(rc.max_restarts, 1))
        bus = RayWeightBus(learner, sampler, samplers, workers, engine)
        placement = Placement(conn, samplers, workers, learner_handle)

        async def close_actors() -> None:
            placement.close()

        scope.push(close_actors)
        assert learner is not None
        scope.push(_closer(learner))
        run = Run(cfg=cfg, role="train", env=env, sampler=sampler, engine=engine, scope=scope)
        run.learner = learner
        run.weight_bus = bus
        run.placement = placement  # type: ignore[attr-defined]
        return run
    except BaseException:
        if learner is not None:
            learner.close()
        for a in actors:
            try:
                ray.kill(a)
            except Exception:
                pass
        conn.close()
        raise


def _closer(learner: RemoteLearner) -> Any:
    async def close() -> None:
        import anyio

        await anyio.to_thread.run_sync(learner.close)

    return close


class Placement:
    """Where the run's actors are, and their teardown (kill, groups, local instance)."""

    def __init__(
        self, conn: cluster.Connection, samplers: list[Any], workers: list[Any], learner: Any
    ) -> None:
        self.conn = conn
        self.samplers = samplers
        self.workers = workers
        self.learner = learner
        self._closed = False

    def describe(self) -> dict[str, Any]:
        """Node and pid of every actor (for tests and ``docs/ray.md``'s dashboard notes)."""
        ray = self.conn.ray
        return {
            "samplers": ray.get([s.describe.remote() for s in self.samplers]),
            "rollout_workers": ray.get([w.describe.remote() for w in self.workers]),
            "learner": ray.get(self.learner.describe.remote()),
        }

    def replica_versions(self) -> list[int]:
        ray = self.conn.ray
        return ray.get([s.version.remote() for s in self.samplers])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        ray = self.conn.ray
        for handle in [*self.workers, *self.samplers]:
            try:
                ray.kill(handle, no_restart=True)
            except Exception:
                pass
        self.conn.close()


__all__ = ["Placement", "ReplicaRouter", "assemble_on_ray"]
