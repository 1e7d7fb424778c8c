"""The Ray backend beside the local one, on one machine.

1. Training throughput: the same config (tiny model, a 200 ms tool on every turn but the
   last, asynchronous), ``orchestrator.backend=local`` vs ``ray``, interleaved repeats;
   trajectories/s over the run (actor start-up excluded, reported apart), and where the
   Ray run spends its extra time (weight publish, learner wait, per-step numbers).
2. Weight publish: SmolLM2-135M's float32 state dict from this process (as the learner
   actor publishes) to 1, 2 and 4 hf sampler replicas (Ray actors), through each transport
   (object store, gloo broadcast), end to end: payload prepared, received, validated and
   copied into each replica's model. Beside it the memcpy floor: one copy of the state dict
   in this process, and that times the replicas.
3. NCCL: not run here (no GPU on this machine); the JSON says so.

    python benchmarks/ray_backend.py            # writes benchmarks/results/ray_backend.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import anyio
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agentrl.config import load_config  # noqa: E402
from agentrl.run.orchestrator import Orchestrator  # noqa: E402
from agentrl.run.plotting import read_steps  # noqa: E402


def training_overrides(args: argparse.Namespace, backend: str) -> list[str]:
    inflight = 2 * args.batch_groups * args.group_size
    out = [
        "model.name=tiny-llama",
        "model.dtype=float32",
        "env.name=benchmarks.latency_env:LatencyEnv",
        f"env.options={{delay_s: {args.delay}, turns: {args.turns}}}",
        f"sampler.max_new_tokens={args.max_new_tokens}",
        f"sampler.max_batch_size={inflight}",
        f"rollout.group_size={args.group_size}",
        f"rollout.concurrency={inflight}",
        f"rollout.max_turns={args.turns}",
        f"rollout.max_tokens={args.turns * (args.max_new_tokens + 16)}",
        f"learner.batch_groups={args.batch_groups}",
        "learner.micro_batch_size=16",
        "learner.lr=1e-4",
        f"orchestrator.max_steps={args.steps}",
        "orchestrator.max_staleness=1",
        "orchestrator.checkpoint_every=0",
        "logging.progress=false",
        "logging.trace=false",
        f"orchestrator.backend={backend}",
    ]
    if backend == "ray":
        cpus = os.cpu_count() or 2
        out += [
            f"ray.num_cpus={cpus}",
            f"ray.samplers.num_cpus={max(cpus // 2, 1)}",
            "ray.rollout_workers.num_cpus=0",
            f"ray.learner.num_cpus={max(cpus // 2, 1)}",
        ]
    return out


def run_training(args: argparse.Namespace, backend: str, run_dir: Path) -> dict[str, float]:
    cfg = load_config(overrides=training_overrides(args, backend))
    t0 = time.perf_counter()
    orch = Orchestrator(cfg, run_dir)
    orch.build()
    built = time.perf_counter() - t0
    t1 = time.perf_counter()
    anyio.run(orch.run)
    wall = time.perf_counter() - t1
    steps = read_steps(run_dir)
    trajs = sum(s["samples"] for s in steps)
    return {
        "backend": backend,
        "start_s": built,
        "wall_s": wall,
        "trajectories": trajs,
        "trajectories_per_s": trajs / wall,
        "train_s": sum(s["train_seconds"] for s in steps),
        "learner_wait_s": sum(s["learner_wait_seconds"] for s in steps),
        "publish_s": sum(s.get("placement/publish_seconds", 0.0) for s in steps),
    }


def bench_publish(args: argparse.Namespace) -> dict[str, object]:
    import ray

    from agentrl.models import load_model, prepare_files
    from agentrl.run.placement.actors import ReplicaClient, SamplerShell
    from agentrl.weights import WeightBus
    from agentrl.weights.broadcast import BroadcastTransport

    prepare_files(args.publish_model)
    model, _ = load_model(args.publish_model, dtype="float32")
    state = {k: v.detach() for k, v in model.state_dict().items()}
    nbytes = sum(
        t.numel() * t.element_size() for t in {t.data_ptr(): t for t in state.values()}.values()
    )

    # the floor: one copy into memory already mapped, as a replica copies into its model
    target = {k: torch.empty_like(v) for k, v in state.items()}
    copies = []
    for _ in range(5):
        t0 = time.perf_counter()
        for k, t in state.items():
            target[k].copy_(t)
        copies.append(time.perf_counter() - t0)
    memcpy = min(copies)
    del target

    cfg = load_config(
        overrides=[
            f"model.name={args.publish_model}",
            "model.dtype=float32",
            "orchestrator.backend=ray",
            "ray.samplers.num_cpus=0",
        ]
    )
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="WARNING")
    try:
        shell = ray.remote(SamplerShell).options(num_cpus=0, max_concurrency=100)
        handles = [shell.remote(cfg, i) for i in range(max(args.replicas))]
        ray.get([h.describe.remote() for h in handles])
        rows = []
        version = 0
        for transport in ("object_store", "gloo"):
            for n in args.replicas:
                name = "ray_object_store" if transport == "object_store" else "gloo"
                clients = [ReplicaClient(h, name) for h in handles[:n]]
                transports: dict[str, object] = {}
                if transport == "gloo":
                    transports["gloo"] = BroadcastTransport("gloo", lambda c=clients: c)
                else:
                    import agentrl.weights.ray_object_store  # noqa: F401

                bus = WeightBus(transports)  # type: ignore[arg-type]
                for c in clients:
                    bus.register(c)
                times = []
                for rep in range(args.publish_repeats + 1):
                    version += 1
                    report = anyio.run(bus.publish, version, state)
                    assert all(c.held == version for c in clients), [c.held for c in clients]
                    if rep > 0:  # the first forms the group / warms the store
                        times.append(report.total_s)
                if transport == "gloo":
                    transports["gloo"].close()  # type: ignore[attr-defined]
                rows.append(
                    {
                        "transport": transport,
                        "replicas": n,
                        "publish_s": statistics.median(times),
                        "publish_s_all": times,
                        "memcpy_floor_s": memcpy * n,
                    }
                )
                print(
                    f"  publish {transport:12s} -> {n} replica(s): {rows[-1]['publish_s']:.3f} s",
                    flush=True,
                )
    finally:
        ray.shutdown()
    return {
        "model": args.publish_model,
        "bytes": nbytes,
        "memcpy_one_copy_s": memcpy,
        "rows": rows,
        "nccl": "not run: no GPU on this machine (the nccl transport is the same code as gloo "
        "with CUDA buffers; untested here)",
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--delay", type=float, default=0.2, help="tool latency (s)")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--batch-groups", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="runs per backend, interleaved")
    ap.add_argument("--publish-model", default="smollm2-135m-instruct")
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--publish-repeats", type=int, default=3)
    ap.add_argument("--skip-training", action="store_true")
    ap.add_argument("--skip-publish", action="store_true")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "ray_backend.json"))
    args = ap.parse_args()

    import tempfile

    result: dict[str, object] = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
        },
        "args": vars(args),
    }
    if not args.skip_training:
        runs: dict[str, list[dict[str, float]]] = {"local": [], "ray": []}
        with tempfile.TemporaryDirectory() as tmp:
            for rep in range(args.repeats):
                for backend in ("local", "ray"):
                    r = run_training(args, backend, Path(tmp) / f"{backend}-{rep}")
                    runs[backend].append(r)
                    print(
                        f"  {backend:5s} run {rep}: {r['trajectories_per_s']:.2f} traj/s",
                        flush=True,
                    )
        med = {b: statistics.median(r["trajectories_per_s"] for r in rs) for b, rs in runs.items()}
        result["training"] = {
            "runs": runs,
            "median_traj_per_s": med,
            "ray_over_local": med["ray"] / med["local"],
        }
    if not args.skip_publish:
        result["publish"] = bench_publish(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))

    print()
    if "training" in result:
        tr = result["training"]
        print(
            "| backend | traj/s (median) | wall s | start s | train s | learner wait s | publish s |"
        )
        print("|---|---|---|---|---|---|---|")
        for b, rs in tr["runs"].items():
            m = rs[len(rs) // 2]
            print(
                f"| {b} | {tr['median_traj_per_s'][b]:.2f} | {m['wall_s']:.1f} | {m['start_s']:.1f} | "
                f"{m['train_s']:.1f} | {m['learner_wait_s']:.1f} | {m['publish_s']:.2f} |"
            )
        print(f"ray / local = {tr['ray_over_local']:.2f}")
    if "publish" in result:
        pb = result["publish"]
        print(f"\nweight publish, {pb['model']} ({pb['bytes'] / 1e6:.0f} MB float32)")
        print("| transport | replicas | publish s | memcpy floor s |")
        print("|---|---|---|---|")
        for r in pb["rows"]:
            print(
                f"| {r['transport']} | {r['replicas']} | {r['publish_s']:.3f} | {r['memcpy_floor_s']:.3f} |"
            )
        print(f"nccl: {pb['nccl']}")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
