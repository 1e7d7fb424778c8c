"""Synchronous vs asynchronous training on a workload with tool latency.

Same config, side by side at each tool latency: `max_staleness: 0` (generate, then train,
barrier) vs asynchronous bounds `max_staleness: k` for each k in ``--staleness`` (default
1, 2, 3: generation overlaps training and up to k + 1 batches of episodes are in flight;
the largest k is the headline). Each episode makes `turns - 1` tool calls that each
wait `delay` seconds (a remote search service, say). Reports trajectories/s over the
whole run (the headline: it includes async's one-time pipeline fill), the steady rate after
the first step, the learner's busy time and idle fraction (waiting for data), the sampler's
idle fraction (no sequence to decode, sampled every 10 ms) and CPU use (process CPU time
over wall time x cores, the learner process included). Both modes keep
``orchestrator.learner_worker: auto``: the learner trains in its own process when async
and in a thread when sync. Sampler weights are bf16 as in configs/demo.yaml (``--dtype``).
Each (latency, mode) runs ``--repeats`` times, interleaved; the median run is reported,
with every repeat's async/sync ratio beside it (on 2 shared cores the async side varied by
~15% from run to run). Target: async >= 1.8x sync in trajectories/s.

    python benchmarks/async_vs_sync.py [--delays 0.2 0.5 1.0] [--staleness 1 2 3]
                                       [--turns 4] [--steps 10] [--dtype bfloat16|float32]
                                       [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentrl.config import load_config
from agentrl.run.events import BatchTrained
from agentrl.run.orchestrator import Orchestrator
from agentrl.run.plotting import read_steps


def _cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the learner process)."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _proc_cpu_seconds(pid: int) -> float:
    """CPU time of a live process so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_mode(args: argparse.Namespace, staleness: int, run_dir: Path) -> dict[str, float]:
    # episodes in flight: every batch the staleness bound lets the producer run ahead on
    inflight = (staleness + 1) * args.batch_groups * args.group_size
    cfg = load_config(
        overrides=[
            f"model.name={args.model}",
            f"model.dtype={args.dtype}",
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
            f"learner.ppo_epochs={args.epochs}",
            "learner.lr=1e-4",
            f"orchestrator.max_steps={args.steps}",
            f"orchestrator.max_staleness={staleness}",
            "orchestrator.checkpoint_every=0",
            "logging.progress=false",
            "logging.trace=false",
            *([f"orchestrator.cpu_threads={args.threads}"] if args.threads else []),
        ]
    )
    orch = Orchestrator(cfg, run_dir)
    orch.build()
    idle = {"samples": 0, "idle": 0}
    trained_at: list[float] = []  # wall time of each finished step
    orch.events.subscribe(
        lambda e: trained_at.append(time.perf_counter()) if isinstance(e, BatchTrained) else None
    )

    async def main() -> float:
        async def watch() -> None:
            while True:
                st = orch.sampler.stats()
                idle["samples"] += 1
                idle["idle"] += int(st["active"] == 0 and st["waiting"] == 0)
                await anyio.sleep(0.01)

        trained_at.append(time.perf_counter())  # the start, before any step
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await orch.run()
            tg.cancel_scope.cancel()
        return time.perf_counter() - trained_at[0]

    # the learner process (when there is one) loaded the model and compiled its kernels in
    # build(); that CPU time is not part of the run
    proc = getattr(orch.learner, "_proc", None)
    startup = _proc_cpu_seconds(proc.pid) if proc is not None else 0.0
    cpu0 = _cpu_seconds()
    wall = anyio.run(main)
    cpu = _cpu_seconds() - cpu0 - startup  # the learner process has ended and been waited for
    steps = read_steps(run_dir)
    if len(steps) < 2 or len(trained_at) < 3:  # a signal (a time limit) stopped the run early
        raise RuntimeError(
            f"the staleness-{staleness} run ended after {len(steps)} of {args.steps} steps "
            "(stopped by a signal?): no steady-state rate to report"
        )
    trajs = sum(s["samples"] for s in steps)
    wait = sum(s["learner_wait_seconds"] for s in steps)
    train = sum(s["train_seconds"] for s in steps)
    # steady state: after the first step, once the pipeline is full (async fills it once)
    after_first = trajs - steps[0]["samples"]
    stats = orch.sampler.stats()
    rewards = [s["reward_mean"] for s in steps if "reward_mean" in s]
    return {
        "max_staleness": staleness,
        "steps": len(steps),
        "wall_s": wall,
        "trajectories": trajs,
        "trajectories_per_s": trajs / wall,
        "steady_trajectories_per_s": after_first / (trained_at[-1] - trained_at[1]),
        "first_step_s": trained_at[1] - trained_at[0],
        "prefill_tokens": stats.get("prefill_tokens", 0),
        "prefix_reused_tokens": stats.get("prefix_reused_tokens", 0),
        "learner_idle_frac": wait / wall,
        "learner_busy_s": train,
        "sampler_idle_frac": idle["idle"] / max(idle["samples"], 1),
        "cpu_util": cpu / wall / (os.cpu_count() or 1),  # all threads, share of all cores
        "staleness_mean": sum(s.get("staleness/mean", 0.0) for s in steps) / max(len(steps), 1),
        # an async step during which no group finished has no rollout numbers
        "reward_first": rewards[0] if rewards else float("nan"),
        "reward_last": rewards[-1] if rewards else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument(
        "--delays",
        type=float,
        nargs="+",
        default=[0.2, 0.5, 1.0],
        help="tool latencies (s) to compare at; the first is the headline",
    )
    ap.add_argument(
        "--turns", type=int, default=4, help="assistant turns; all but the last call the tool"
    )
    ap.add_argument("--max-new-tokens", type=int, default=16, help="per assistant turn")
    ap.add_argument(
        "--dtype",
        default="bfloat16",
        choices=["bfloat16", "float32"],
        help="sampler weights (model.dtype); bfloat16 as in configs/demo.yaml",
    )
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--batch-groups", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=1, help="PPO epochs per learner step")
    ap.add_argument(
        "--staleness",
        type=int,
        nargs="+",
        default=[1, 2, 3],
        help="async staleness bounds to run beside sync; the largest is the headline",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="torch threads in both modes (0: the orchestrator's default, half the cores in async)",
    )
    ap.add_argument(
        "--repeats", type=int, default=3, help="runs per (latency, mode); the median is reported"
    )
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "async_vs_sync.json"))
    args = ap.parse_args()
    if any(k < 1 for k in args.staleness):
        ap.error("--staleness: async bounds are >= 1 (sync, 0, always runs)")
    modes = [0, *sorted(set(args.staleness))]
    head_k, head_d = modes[-1], args.delays[0]

    runs = []  # every (repeat, delay, mode), interleaved so machine noise hits every mode
    with tempfile.TemporaryDirectory() as tmp:
        # not reported: compiles the learner's fused kernels (agentrl.algos.fused) and loads
        # the model files once, so the first measured run does not pay for it
        run_mode(
            argparse.Namespace(**{**vars(args), "delay": 0.0, "steps": 2}), 0, Path(tmp) / "warmup"
        )
        for rep in range(args.repeats):
            for delay in args.delays:
                for k in modes:
                    run = run_mode(
                        argparse.Namespace(**{**vars(args), "delay": delay}),
                        k,
                        Path(tmp) / f"r{rep}-d{delay}-k{k}",
                    )
                    runs.append({"repeat": rep, "delay_s": delay, **run})

    def runs_of(delay: float, k: int) -> list[dict]:
        return [r for r in runs if r["delay_s"] == delay and r["max_staleness"] == k]

    # one row per (delay, mode): the run with the median trajectories/s
    rows = []
    for delay in args.delays:
        for k in modes:
            mine = sorted(runs_of(delay, k), key=lambda r: r["trajectories_per_s"])
            rows.append({**mine[len(mine) // 2], "range": [mine[0], mine[-1]]})
    row = {(r["delay_s"], r["max_staleness"]): r for r in rows}

    def ratio(delay: float, k: int, key: str) -> float:
        return row[delay, k][key] / row[delay, 0][key]

    speedups = {
        f"{d}/k={k}": ratio(d, k, "trajectories_per_s") for d in args.delays for k in modes[1:]
    }
    steady = {
        f"{d}/k={k}": ratio(d, k, "steady_trajectories_per_s")
        for d in args.delays
        for k in modes[1:]
    }
    pairs = {  # async / sync of each repeat (same repeat, same latency), to show the spread
        f"{d}/k={k}": sorted(
            a["trajectories_per_s"] / s["trajectories_per_s"]
            for s, a in zip(runs_of(d, 0), runs_of(d, k), strict=True)
        )
        for d in args.delays
        for k in modes[1:]
    }

    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"sync vs async ({args.model}, {args.turns - 1} tool calls per episode, "
        f"{args.steps} steps, {os.cpu_count()} CPU cores; median of {args.repeats} runs)"
    )
    cols = ("tool latency", "mode", "traj/s", "steady traj/s", "wall s", "first step s")
    cols += ("learner busy s", "learner idle", "sampler idle", "CPU use", "staleness")
    for col in (*cols, "async/sync (steady)", "per repeat"):
        table.add_column(col, justify="right")
    for r in rows:
        k = r["max_staleness"]
        key = f"{r['delay_s']}/k={k}"
        table.add_row(
            f"{r['delay_s'] * 1000:.0f} ms",
            "sync (k=0)" if k == 0 else f"async (k={k})",
            f"{r['trajectories_per_s']:.2f}",
            f"{r['steady_trajectories_per_s']:.2f}",
            f"{r['wall_s']:.1f}",
            f"{r['first_step_s']:.1f}",
            f"{r['learner_busy_s']:.1f}",
            f"{r['learner_idle_frac']:.0%}",
            f"{r['sampler_idle_frac']:.0%}",
            f"{r['cpu_util']:.0%}",
            f"{r['staleness_mean']:.2f}",
            "" if k == 0 else f"{speedups[key]:.2f}x ({steady[key]:.2f}x)",
            "" if k == 0 else " ".join(f"{x:.2f}" for x in pairs[key]),
        )
    console = Console(width=max(Console().width, 170))
    console.print(table)
    head = f"{head_d}/k={head_k}"
    console.print(
        f"async (k={head_k}) / sync trajectories/s at {head_d * 1000:.0f} ms: "
        f"[bold]{speedups[head]:.2f}x[/] (target >= 1.8x); steady state {steady[head]:.2f}x"
    )
    result = {
        "benchmark": "async_vs_sync",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "args": vars(args),
        "rows": rows,
        "runs": runs,
        "speedup_by_delay_and_staleness": speedups,
        "speedup_per_repeat": pairs,
        "steady_speedup_by_delay_and_staleness": steady,
        "headline": {"delay_s": head_d, "max_staleness": head_k},
        "speedup": speedups[head],
        "target": 1.8,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
