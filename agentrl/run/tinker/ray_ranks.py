"""The engine's ranks as Ray actors: ``orchestrator.backend: ray`` with ``learner.world_size: n``.

Rank 0 runs on the server's node (it writes the ``tinker://`` checkpoints under
``--state-dir`` and hosts the group's rendezvous), ranks 1..n-1 in a placement group of one
``ray.learner`` bundle each (``ray.placement_strategy``), as a training run places its
learner ranks. Each actor holds a :class:`~agentrl.run.tinker.ranks.RankEngine`; the server
sends every request to every actor at once and answers with rank 0's result. Checkpoints
are read back by every rank: on several nodes ``--state-dir`` must be a shared folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.config import Config
from agentrl.run.tinker.ranks import RankEngineProxy, join_and_load
from agentrl.run.tinker.remote import describe, run_method


class RankShell:
    """Rank `rank` of the engine in a Ray actor (its settings resolved on its node)."""

    def __init__(self, cfg: Config, rank: int, address: str, state_dir: str) -> None:
        import torch

        from agentrl.run.process_settings import apply_process_settings
        from agentrl.run.tinker.placement import engine_settings

        apply_process_settings(cfg)
        torch.set_num_threads(cfg.orchestrator.cpu_threads or max(1, int(cfg.ray.learner.num_cpus)))
        settings = engine_settings(cfg)
        self.rank = rank
        self.engine = join_and_load(settings, Path(state_dir), rank, settings.world_size, address)

    def describe(self) -> dict[str, Any]:
        import ray

        return describe(self.engine) | {"node": ray.get_runtime_context().get_node_id()}

    def call(self, method: str, *args: Any) -> Any:
        out = run_method(self.engine, method, args)
        return out if self.rank == 0 else None


def start_ray_ranks(cfg: Config, state_dir: Path) -> RankEngineProxy:
    """``learner.world_size`` rank actors and the proxy the server holds; closing the proxy
    kills them and leaves the cluster."""
    import agentrl.run.placement.cluster as cluster
    from agentrl.models import load_tokenizer, prepare_files
    from agentrl.run.placement.learner_process import free_port

    conn = cluster.connect(cfg)
    ray = conn.ray
    role, world = cfg.ray.learner, cfg.learner.world_size
    timeout = cfg.ray.start_timeout_s
    actors: list[Any] = []
    try:
        prepare_files(cfg.model.name)
        address = f"tcp://{ray.util.get_node_ip_address()}:{free_port()}"
        options = {
            "num_cpus": role.num_cpus,
            "num_gpus": role.num_gpus,
            "resources": dict(role.resources),
            "max_restarts": 0,
            "max_concurrency": 1,
        }
        shell = ray.remote(RankShell)
        folder = str(Path(state_dir).resolve())
        actors.append(
            shell.options(**options, **cluster.on_this_node(ray)).remote(cfg, 0, address, folder)
        )
        pg = cluster.placement_group(conn, cfg, "learner", world - 1, timeout)
        for r in range(1, world):
            placed = shell.options(**options, **cluster.scheduling(pg, r - 1))
            actors.append(placed.remote(cfg, r, address, folder))
        what = f"the Tinker engine's {world} rank actors (ray.learner: {cluster.demand(role)} each)"
        infos = cluster.wait_started(
            ray, [a.describe.remote() for a in actors], what, timeout + 120
        )
    except BaseException:
        for a in actors:
            ray.kill(a, no_restart=True)
        conn.close()
        raise

    def call(method: str, *args: Any) -> Any:
        refs = [a.call.remote(method, *args) for a in actors]
        results, failure = [], None
        for rank, ref in enumerate(refs):
            try:
                results.append(ray.get(ref))
            except ray.exceptions.RayTaskError as e:
                failure = failure or e.cause  # rank 0's error first (every rank fails alike)
            except ray.exceptions.RayError as e:
                first = (str(e).strip().splitlines() or [""])[0]
                raise RuntimeError(
                    f"Tinker engine rank {rank} (a Ray actor) failed while running {method} "
                    f"({type(e).__name__}: {first}); restart agentrl serve --tinker"
                ) from None
        if failure is not None:
            raise failure
        return results[0]

    def close() -> None:
        for a in actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # already gone with the cluster
                pass
        conn.close()

    pids = [i["pid"] for i in infos]
    where = f"{world} ranks ({cfg.learner.parallel}) as Ray actors, pids {pids}"
    tokenizer = load_tokenizer(cfg.model.name)
    return RankEngineProxy(call, infos[0], tokenizer, state_dir, close, where, pids)
