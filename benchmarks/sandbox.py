"""Sandbox speed: spawn reference, cold start, warm-call latency, concurrent throughput.

    .venv/bin/python benchmarks/sandbox.py [--backends bwrap,subprocess,docker] [--quick]

Prints a table and writes benchmarks/results/sandbox.json (+ sandbox.png). Measures, in one
run and per backend:
  - reference: bare `python -I -c pass` spawn time of the sandbox interpreter;
  - cold start: from nothing to the first result of `pass` (spawn + sandbox + kernel);
  - warm call p50/p99: a trivial snippet in a live session;
  - throughput: trivial calls per second over 16 concurrent sessions.
Targets (bwrap): warm p50 <= 2 ms, cold start <= 50 ms. The machine's load average is
recorded too: on a shared box every number moves with it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import anyio

from agentrl.errors import AgentRLError
from agentrl.sandbox import create_sandbox

RESULTS = Path(__file__).resolve().parent / "results"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def bare_spawn(python: str, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([python, "-I", "-c", "pass"], check=True)
        times.append(time.perf_counter() - t0)
    return times


async def measure(backend: str, n_cold: int, n_warm: int, seconds: float) -> dict[str, Any]:
    extra: dict[str, Any] = {"allow_insecure": True} if backend == "subprocess" else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        cold_sb = create_sandbox(backend, pool_size=0, **extra)
    cold: list[float] = []
    start_cpu: list[float] = []  # CPU the interpreter spent starting (load-independent)
    try:
        for _ in range(n_cold):
            t0 = time.perf_counter()
            async with cold_sb.session() as s:
                res = await s.run("pass")
                cold.append(time.perf_counter() - t0)
                reported = getattr(s._kernel, "_cpu_reported", None)
                if reported is not None:
                    start_cpu.append(reported - res.cpu_s)
            assert res.ok, res
    finally:
        await cold_sb.close()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        sb = create_sandbox(backend, pool_size=16, max_sessions=16, **extra)
    try:
        await sb.warm_up()
        warm: list[float] = []
        async with sb.session() as s:
            for _ in range(20):  # let caches settle
                await s.run("x = 1")
            for _ in range(n_warm):
                t0 = time.perf_counter()
                res = await s.run("x = 1")
                warm.append(time.perf_counter() - t0)
            assert res.ok, res

        calls = 0
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal calls
            async with sb.session() as s:
                while time.perf_counter() < deadline:
                    r = await s.run("x = 1")
                    assert r.ok, r
                    calls += 1

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(16):
                tg.start_soon(worker)
        elapsed = time.perf_counter() - t0
    finally:
        await sb.close()
    return {
        "cold_start_ms": {
            "p50": 1000 * statistics.median(cold),
            "p90": 1000 * pct(cold, 0.9),
            "n": len(cold),
            "kernel_start_cpu_p50": 1000 * statistics.median(start_cpu) if start_cpu else None,
        },
        "warm_call_ms": {
            "p50": 1000 * pct(warm, 0.5),
            "p99": 1000 * pct(warm, 0.99),
            "n": len(warm),
        },
        "throughput_16_sessions_calls_per_s": calls / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default="bwrap,subprocess,docker")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--out", default=str(RESULTS / "sandbox.json"))
    args = parser.parse_args()
    n_cold, n_warm, seconds, n_bare = (10, 300, 2.0, 10) if args.quick else (30, 2000, 5.0, 30)

    python = "/usr/bin/python3"
    bare = bare_spawn(python, n_bare)
    results: dict[str, Any] = {
        "notes": [
            "docker cold start = a kernel exec'd into an already created (warm, scrubbed) "
            "container; creating a container costs ~0.7 s more",
            "kernel_start_cpu_p50 = CPU the sandboxed interpreter used to start (user+sys), "
            "which does not grow with the machine's load the way wall times do",
        ],
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_before": os.getloadavg(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
        },
        "reference_python_c_pass_ms": {
            "p50": 1000 * statistics.median(bare),
            "p90": 1000 * pct(bare, 0.9),
            "n": len(bare),
            "python": python,
        },
        "backends": {},
        "targets": {"bwrap_warm_p50_ms": 2.0, "bwrap_cold_start_ms": 50.0},
    }
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        try:
            results["backends"][backend] = anyio.run(measure, backend, n_cold, n_warm, seconds)
        except AgentRLError as e:
            results["backends"][backend] = {"unavailable": str(e)[:300]}
    results["machine"]["loadavg_after"] = os.getloadavg()

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)
    plot(results, out.with_suffix(".png"))
    print(json.dumps(results, indent=2))
    print(f"wrote {out}")


def print_table(results: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    ref = results["reference_python_c_pass_ms"]
    table = Table(title=f"sandbox speed (bare `python -c pass`: {ref['p50']:.1f} ms p50)")
    cols = (
        "backend",
        "cold p50 ms",
        "start CPU ms",
        "warm p50 ms",
        "warm p99 ms",
        "16-sess calls/s",
    )
    for col in cols:
        table.add_column(col, justify="right" if col != "backend" else "left")
    for name, r in results["backends"].items():
        if "unavailable" in r:
            table.add_row(name, "-", "-", "-", "-", r["unavailable"][:60])
            continue
        table.add_row(
            name,
            f"{r['cold_start_ms']['p50']:.1f}",
            "-"
            if r["cold_start_ms"]["kernel_start_cpu_p50"] is None
            else f"{r['cold_start_ms']['kernel_start_cpu_p50']:.1f}",
            f"{r['warm_call_ms']['p50']:.3f}",
            f"{r['warm_call_ms']['p99']:.3f}",
            f"{r['throughput_16_sessions_calls_per_s']:.0f}",
        )
    Console().print(table)
    load = results["machine"]
    print(f"load average before/after: {load['loadavg_before']} / {load['loadavg_after']}")


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, r in results["backends"].items() if "unavailable" not in r]
    if not names:
        return
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    ref = results["reference_python_c_pass_ms"]["p50"]
    cold = [results["backends"][n]["cold_start_ms"]["p50"] for n in names]
    axes[0].bar(["bare python", *names], [ref, *cold], color=["grey"] + ["C0"] * len(names))
    axes[0].set_title("cold start p50 (ms)")
    warm = [results["backends"][n]["warm_call_ms"]["p50"] for n in names]
    axes[1].bar(names, warm, color="C1")
    axes[1].set_title("warm call p50 (ms)")
    tput = [results["backends"][n]["throughput_16_sessions_calls_per_s"] for n in names]
    axes[2].bar(names, tput, color="C2")
    axes[2].set_title("calls/s, 16 sessions")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
