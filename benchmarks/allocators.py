"""The learner's step and peak memory under each C allocator (``orchestrator.cpu_allocator``).

SmolLM2-135M in float32 on ``benchmarks/vs_trl.py``'s batch as the learner sees it (2
groups x 8 samples sharing a 46-token prompt, 64 model tokens), oneDNN linears, one torch
thread (the learner process of an asynchronous run on 2 cores), micro-batches of 4 (the
benchmark's async row) and 8. Each (allocator, micro-batch) runs in a fresh process, 4
steps; the first two are warm-up (AdamW's state is made in the first, so the second is
the first steady one), steps 3-4 are timed. Rounds interleave every variant, so a burst of
load on the shared machine hits all of them.

Allocators: ``compact`` and ``reuse`` (glibc, ``agentrl.cpu.set_allocator``),
``tcmalloc`` (gperftools', preloaded with ``agentrl.cpu.allocator_env`` as a run does),
and, where Debian's libjemalloc2 is installed, ``jemalloc`` (preloaded, its defaults) for
reference. Peak RSS is the process's VmHWM after the last step.

    .venv/bin/python benchmarks/allocators.py [--rounds 2] [--micro-batches 4 8]

Prints a table and writes benchmarks/results/allocators.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
STEPS = 4
WARMUP = 2


def child(allocator: str, micro_batch: int) -> dict:
    """`STEPS` learner steps in this process (started with the allocator preloaded)."""
    sys.path.insert(0, str(ROOT))
    from agentrl.cpu import set_allocator, tcmalloc_loaded

    if allocator in ("compact", "reuse"):  # the preloaded ones replace glibc's malloc
        set_allocator(allocator)
    import torch

    torch.set_num_threads(1)
    from agentrl.config import config_from_dict
    from agentrl.cpu_linear import route_linears
    from agentrl.learner import Learner
    from agentrl.models import load_model
    from agentrl.run.settings import resolve
    from benchmarks.memory import _status_mb, shared_prompt_groups

    maps = Path("/proc/self/maps").read_text()
    if allocator == "tcmalloc" and not tcmalloc_loaded():
        raise SystemExit("tcmalloc was asked for but is not loaded")
    if allocator == "jemalloc" and "libjemalloc" not in maps:
        raise SystemExit("jemalloc was asked for but is not loaded")
    policy, tokenizer = load_model("smollm2-135m-instruct", dtype="float32")
    kernel = route_linears(policy, "auto")
    cfg = config_from_dict(
        {
            "learner": {"lr": 1e-6, "micro_batch_size": micro_batch},
            "algorithm": {"off_policy": "tis"},
            "orchestrator": {"max_staleness": 1},
        }
    )
    learner = Learner(policy, tokenizer, resolve(cfg).learner)
    learner.warmup()
    groups = shared_prompt_groups(policy.config.vocab_size)
    seconds = []
    for _ in range(STEPS):
        t0 = time.perf_counter()
        learner.step(groups)
        seconds.append(time.perf_counter() - t0)
    return {
        "step_s": seconds,
        "peak_rss_mb": _status_mb("VmHWM"),
        "rss_after_mb": _status_mb("VmRSS"),
        "linear": kernel,
    }


def run(allocator: str, micro_batch: int) -> dict:
    from agentrl.cpu import allocator_env

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("LD_PRELOAD", None)
    if allocator == "tcmalloc":
        env = allocator_env("tcmalloc", env)
    elif allocator == "jemalloc":
        env["LD_PRELOAD"] = JEMALLOC
    load = os.getloadavg()[0]
    out = subprocess.run(
        [sys.executable, __file__, "--child", allocator, "--child-mb", str(micro_batch)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    if out.returncode != 0:
        raise SystemExit(f"{allocator} mb{micro_batch} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    timed = result["step_s"][WARMUP:]
    return {
        "allocator": allocator,
        "micro_batch": micro_batch,
        "s_per_step": sum(timed) / len(timed),
        "loadavg_before": load,
        **result,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--micro-batches", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--allocators", nargs="+", default=None)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "allocators.json"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-mb", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.child_mb)))
        return
    sys.path.insert(0, str(ROOT))
    from agentrl.cpu import tcmalloc_library
    from benchmarks.vs_trl import machine

    allocators = args.allocators or [
        "compact",
        "reuse",
        *(["tcmalloc"] if tcmalloc_library() else []),
        *(["jemalloc"] if Path(JEMALLOC).exists() else []),
    ]
    runs = []
    for r in range(args.rounds):
        for mb in args.micro_batches:
            for allocator in allocators:
                res = run(allocator, mb)
                res["round"] = r
                runs.append(res)
                print(
                    f"round {r} mb{mb} {allocator:<9} {res['s_per_step']:.2f} s/step, "
                    f"peak RSS {res['peak_rss_mb']:.0f} MB (load {res['loadavg_before']:.1f})",
                    flush=True,
                )
    rows = []
    for mb in args.micro_batches:
        mine_rows = []
        for allocator in allocators:
            mine = [x for x in runs if x["allocator"] == allocator and x["micro_batch"] == mb]
            mine_rows.append(
                {
                    "allocator": allocator,
                    "micro_batch": mb,
                    "s_per_step_median": statistics.median(x["s_per_step"] for x in mine),
                    "s_per_step_rounds": [x["s_per_step"] for x in mine],
                    "peak_rss_mb_max": max(x["peak_rss_mb"] for x in mine),
                }
            )
        # the ratios are to glibc's compact (the first row when it was not run)
        base = next((r for r in mine_rows if r["allocator"] == "compact"), mine_rows[0])
        for row in mine_rows:
            row["speed_vs_compact"] = base["s_per_step_median"] / row["s_per_step_median"]
            row["peak_vs_compact_mb"] = row["peak_rss_mb_max"] - base["peak_rss_mb_max"]
        rows += mine_rows
    print("\n| micro-batch | allocator | s/step (rounds) | vs compact | peak RSS MB | vs compact |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        rounds = ", ".join(f"{s:.2f}" for s in row["s_per_step_rounds"])
        print(
            f"| {row['micro_batch']} | {row['allocator']} | {row['s_per_step_median']:.2f} "
            f"({rounds}) | {row['speed_vs_compact']:.2f}x | {row['peak_rss_mb_max']:,.0f} | "
            f"{row['peak_vs_compact_mb']:+,.0f} |"
        )
    result = {
        "workload": "SmolLM2-135M float32, 2 x 8 samples, shared 46-token prompt, 64 model "
        "tokens, oneDNN linears, 1 torch thread; steps 3-4 timed",
        "machine": machine(),
        "rows": rows,
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
