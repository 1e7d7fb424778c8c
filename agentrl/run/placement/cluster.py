"""Ray itself: connecting, checking what the config asks of the cluster, placement groups.

Every check here runs before any model is loaded and ends in one line naming the setting
and the fix: Ray missing or too old, an unreachable address, a role asking for resources
the cluster does not have (GPUs on a CPU cluster, a custom resource no node offers).
"""

from __future__ import annotations

import math
import os
import socket
import sys
from dataclasses import dataclass, field
from typing import Any

from agentrl.config import Config, RayRoleConfig
from agentrl.errors import ConfigError, PluginError
from agentrl.extras import require

MIN_RAY = (2, 9)
ROLES = ("samplers", "rollout_workers", "learner")


def import_ray() -> Any:
    ray = require("ray", "ray", "orchestrator.backend=ray")
    version = tuple(int(p) for p in ray.__version__.split(".")[:2] if p.isdigit())
    if version < MIN_RAY:
        raise ConfigError(
            f"orchestrator.backend=ray: Ray {ray.__version__} is not supported (need >= "
            f"{'.'.join(map(str, MIN_RAY))}): pip install -U 'agentrl[ray]'"
        )
    return ray


def address_of(cfg: Config) -> tuple[str | None, str]:
    """(address, which setting gave it): ray.address, else RAY_ADDRESS, else None (local)."""
    if cfg.ray.address:
        return cfg.ray.address, "ray.address"
    env = os.environ.get("RAY_ADDRESS")
    return (env, "RAY_ADDRESS") if env else (None, "")


def _check_reachable(address: str, setting: str) -> None:
    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(
            f"{setting}={address!r} is not host:port (e.g. 10.0.0.5:6379, ray://10.0.0.5:10001 "
            "or auto)"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    except OSError as e:
        raise ConfigError(
            f"{setting}={address}: nothing answers there ({e.strerror or e}); start the head "
            "with `ray start --head` on that machine, or unset it to run a local Ray instance"
        ) from None


@dataclass
class Connection:
    """The driver's Ray connection; :meth:`close` undoes only what :func:`connect` did."""

    ray: Any
    started_here: bool  # a local instance this run started (stopped with it)
    connected_here: bool  # ray.init called by us (ray.shutdown on close)
    address: str | None
    placement_groups: list[Any] = field(default_factory=list)
    reaper: Any = None  # a local instance's watchdog process (see _REAPER)

    def close(self) -> None:
        ray = self.ray
        for pg in self.placement_groups:
            try:
                ray.util.remove_placement_group(pg)
            except Exception:  # the cluster is going away with us anyway
                pass
        self.placement_groups.clear()
        if self.connected_here and ray.is_initialized():
            ray.shutdown()
        self.connected_here = False
        if self.reaper is not None:  # the instance is down: nothing left to reap
            self.reaper.kill()
            self.reaper.wait()
            self.reaper = None


def connect(cfg: Config) -> Connection:
    """Connect to ``ray.address`` / ``RAY_ADDRESS`` or start a local instance."""
    ray = import_ray()
    if ray.is_initialized():  # the caller (a test, a notebook) already connected
        return Connection(ray, started_here=False, connected_here=False, address=None)
    address, setting = address_of(cfg)
    if address is not None:
        _check_reachable(address, setting)
    # workers import the run's plug-ins (module:Class) the way the driver does
    paths = [p for p in [os.getcwd(), *sys.path] if p and os.path.isdir(p)]
    runtime_env = {"env_vars": {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}}
    kwargs: dict[str, Any] = {
        "runtime_env": runtime_env,
        "log_to_driver": True,
        "logging_level": "WARNING",
        "configure_logging": True,
    }
    if address is None:
        kwargs.update(include_dashboard=False, num_cpus=local_num_cpus(cfg))
        kwargs["num_gpus"] = _local_gpus()
    else:
        kwargs["address"] = address
        del kwargs["runtime_env"]  # remote nodes have their own paths; plug-ins must be installed
    try:
        ray.init(**kwargs)
    except ConnectionError as e:
        raise ConfigError(
            f"{setting}={address}: cannot join the Ray cluster ({e}); check the address of "
            "`ray start --head`"
        ) from None
    conn = Connection(ray, started_here=address is None, connected_here=True, address=address)
    if conn.started_here:
        conn.reaper = _start_reaper()
    return conn


# Runs beside a local instance: when the driver dies without closing (SIGKILL), it kills the
# instance's processes that would outlive it (Ray's own agents do); exits with the driver.
_REAPER = """
import os, signal, sys, time
driver, pids = int(sys.argv[1]), [int(p) for p in sys.argv[2:]]
while os.getppid() == driver:
    time.sleep(0.5)
for pid in pids:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"ray" in f.read():
                os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
"""


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def _start_reaper() -> Any:
    import subprocess

    if not os.path.isdir("/proc"):  # not Linux: Ray's own reaper is all there is
        return None
    pids = [str(p) for p in _descendants(os.getpid())]
    return subprocess.Popen([sys.executable, "-c", _REAPER, str(os.getpid()), *pids])


def _local_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0


def local_num_cpus(cfg: Config) -> int:
    """CPUs of a local instance this run starts: ``ray.num_cpus`` when set, else the larger of
    the machine's cores and what the roles reserve in all. Ray's CPUs are scheduling tokens
    (threads are set per actor), so the default roles start on a 2-core laptop."""
    if cfg.ray.num_cpus is not None:
        return cfg.ray.num_cpus
    return max(os.cpu_count() or 1, math.ceil(total_demand(cfg).get("CPU", 0.0)))


def total_demand(cfg: Config) -> dict[str, float]:
    """What all roles reserve together (samplers + rollout workers + learner.world_size learner ranks)."""
    needed: dict[str, float] = {}
    for role in ROLES:
        rc: RayRoleConfig = getattr(cfg.ray, role)
        n = cfg.learner.world_size if role == "learner" else rc.replicas
        for k, v in demand(rc).items():
            needed[k] = needed.get(k, 0.0) + v * n
    return needed


def demand(role: RayRoleConfig, replicas: int | None = None) -> dict[str, float]:
    """What one actor of `role` reserves, in Ray's resource names."""
    out = {"CPU": role.num_cpus, "GPU": role.num_gpus, **role.resources}
    return {k: v for k, v in out.items() if v > 0}


def check_resources(cfg: Config, ray: Any) -> None:
    """Every role fits the cluster: totals, and each actor on some node. One line if not."""
    total = ray.cluster_resources()
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    for role in ROLES:
        rc: RayRoleConfig = getattr(cfg.ray, role)
        n = cfg.learner.world_size if role == "learner" else rc.replicas
        one = demand(rc)
        for k, v in one.items():
            if total.get(k, 0.0) < v * n:
                setting = _setting_for(role, k)
                have = total.get(k, 0.0)
                fix = (
                    f"set {setting}=0 or add {k} nodes"
                    if have == 0
                    else f"lower {setting} or ray.{role}.replicas"
                )
                raise ConfigError(
                    f"{setting}={v:g} x {n} actor(s) of ray.{role} needs {v * n:g} {k}; the "
                    f"cluster has {have:g}: {fix}"
                )
        if one and not any(all(node.get(k, 0.0) >= v for k, v in one.items()) for node in nodes):
            raise ConfigError(
                f"ray.{role}: no node has {one} for one actor (nodes have "
                f"{[_brief(n) for n in nodes]}); lower ray.{role}.num_cpus/num_gpus/resources"
            )
    for k, v in total_demand(cfg).items():
        if total.get(k, 0.0) < v:
            raise ConfigError(
                f"the ray section asks for {v:g} {k} in all (samplers + rollout workers + "
                f"learner); the cluster has {total.get(k, 0.0):g}: lower a role's num_cpus or "
                "replicas, or start Ray with more (ray.num_cpus for a local instance)"
            )


def _setting_for(role: str, resource: str) -> str:
    key = {"CPU": "num_cpus", "GPU": "num_gpus"}.get(resource, f"resources.{resource}")
    return f"ray.{role}.{key}"


def _brief(resources: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in resources.items() if not k.startswith(("node:", "memory", "object"))}


def placement_group(
    conn: Connection, cfg: Config, role: str, replicas: int, timeout_s: float
) -> Any | None:
    """One bundle per actor of `role`, placed with ``ray.placement_strategy``; None when an
    actor reserves nothing (Ray refuses empty bundles)."""
    ray = conn.ray
    from ray.util.placement_group import placement_group as make_pg

    bundle = demand(getattr(cfg.ray, role))
    if not bundle:
        return None
    pg = make_pg([dict(bundle) for _ in range(replicas)], strategy=cfg.ray.placement_strategy)
    conn.placement_groups.append(pg)
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        raise ConfigError(
            f"ray.{role}: {replicas} bundle(s) of {bundle} with ray.placement_strategy="
            f"{cfg.ray.placement_strategy} could not be placed within {timeout_s:g} s "
            f"(available: {_brief(ray.available_resources())}); use PACK/SPREAD instead of "
            "STRICT_*, or lower the role's resources"
        )
    return pg


def scheduling(pg: Any | None, index: int) -> dict[str, Any]:
    """Actor options that put it in bundle `index` of `pg` (nothing without a group)."""
    if pg is None:
        return {}
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=index
        )
    }


def on_this_node(ray: Any) -> dict[str, Any]:
    """Actor options that pin it to the driver's node (the learner writes the run's
    checkpoints into the driver's run directory)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node, soft=False)}


def wait_started(ray: Any, refs: list[Any], what: str, timeout_s: float) -> list[Any]:
    """Wait for actors' first calls; a timeout or a constructor error becomes one line
    naming `what` (and, on a timeout, what the cluster has free)."""
    try:
        return ray.get(refs, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise ConfigError(
            f"{what} did not start within {timeout_s:g} s (ray.start_timeout_s, plus time to "
            f"load a model where it loads one; available resources: "
            f"{_brief(ray.available_resources())})"
        ) from None
    except ray.exceptions.RayError as e:
        cause = getattr(e, "cause", None) or e
        first = str(cause).strip().splitlines()[-1] if str(cause).strip() else repr(cause)
        raise PluginError(f"{what} failed to start: {type(cause).__name__}: {first}") from None
