"""Synchronous vs asynchronous training on a workload with 200 ms tool latency.

Same config, two modes, one run: `max_staleness: 0` (generate, then train, barrier) vs
`max_staleness: 2` (generation overlaps training). Reports trajectories/s, the learner's
idle fraction (waiting for data) and the sampler's idle fraction (no sequence to decode,
sampled every 10 ms). Target: async >= 1.8x sync in trajectories/s.

    python benchmarks/async_vs_sync.py [--steps 8] [--model tiny-llama] [--delay 0.2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentrl.config import load_config
from agentrl.orchestrator import Orchestrator
from agentrl.plotting import read_steps


def run_mode(args: argparse.Namespace, staleness: int, run_dir: Path) -> dict[str, float]:
    cfg = load_config(
        overrides=[
            f"model.name={args.model}",
            "model.dtype=float32",
            "env.name=benchmarks.latency_env:LatencyEnv",
            f"env.options={{delay_s: {args.delay}, turns: 2}}",
            "sampler.max_new_tokens=16",
            "sampler.max_batch_size=64",
            f"rollout.group_size={args.group_size}",
            "rollout.concurrency=64",
            "rollout.max_turns=2",
            "rollout.max_tokens=128",
            f"learner.batch_groups={args.batch_groups}",
            "learner.micro_batch_size=16",
            f"learner.ppo_epochs={args.epochs}",
            "learner.lr=1e-4",
            f"orchestrator.max_steps={args.steps}",
            f"orchestrator.max_staleness={staleness}",
            "orchestrator.checkpoint_every=0",
            "logging.progress=false",
            "logging.trace=false",
            f"orchestrator.cpu_threads={args.threads}",
        ]
    )
    orch = Orchestrator(cfg, run_dir)
    orch.build()
    idle = {"samples": 0, "idle": 0}

    async def main() -> float:
        async def watch() -> None:
            while True:
                st = orch.sampler.stats()
                idle["samples"] += 1
                idle["idle"] += int(st["active"] == 0 and st["waiting"] == 0)
                await anyio.sleep(0.01)

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await orch.run()
            tg.cancel_scope.cancel()
        return time.perf_counter() - t0

    wall = anyio.run(main)
    steps = read_steps(run_dir)
    trajs = sum(s["samples"] for s in steps)
    wait = sum(s["learner_wait_seconds"] for s in steps)
    train = sum(s["train_seconds"] for s in steps)
    return {
        "max_staleness": staleness,
        "steps": len(steps),
        "wall_s": wall,
        "trajectories": trajs,
        "trajectories_per_s": trajs / wall,
        "learner_idle_frac": wait / wall,
        "learner_busy_s": train,
        "sampler_idle_frac": idle["idle"] / max(idle["samples"], 1),
        "staleness_mean": sum(s.get("staleness/mean", 0.0) for s in steps) / max(len(steps), 1),
        "reward_first": steps[0]["reward_mean"],
        "reward_last": steps[-1]["reward_mean"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--delay", type=float, default=0.2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--batch-groups", type=int, default=4)
    ap.add_argument(
        "--epochs",
        type=int,
        default=1,
        help="PPO epochs: makes a learner step cost about a rollout",
    )
    ap.add_argument("--staleness", type=int, default=2)
    ap.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="torch threads in both modes (the sampler mostly waits on the tool here)",
    )
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "async_vs_sync.json"))
    args = ap.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in (0, args.staleness):
            rows.append(run_mode(args, k, Path(tmp) / f"k{k}"))
    speedup = rows[1]["trajectories_per_s"] / rows[0]["trajectories_per_s"]

    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"sync vs async ({args.model}, {args.delay * 1000:.0f} ms tool latency, {args.steps} steps)"
    )
    for col in ("mode", "traj/s", "wall s", "learner idle", "sampler idle", "staleness"):
        table.add_column(col, justify="right")
    for r in rows:
        mode = "sync (k=0)" if r["max_staleness"] == 0 else f"async (k={r['max_staleness']})"
        table.add_row(
            mode,
            f"{r['trajectories_per_s']:.2f}",
            f"{r['wall_s']:.1f}",
            f"{r['learner_idle_frac']:.0%}",
            f"{r['sampler_idle_frac']:.0%}",
            f"{r['staleness_mean']:.2f}",
        )
    console = Console()
    console.print(table)
    console.print(f"async / sync trajectories/s: [bold]{speedup:.2f}x[/] (target >= 1.8x)")
    result = {
        "benchmark": "async_vs_sync",
        "machine": {"cpus": __import__("os").cpu_count(), "platform": platform.platform()},
        "args": vars(args),
        "rows": rows,
        "speedup": speedup,
        "target": 1.8,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
