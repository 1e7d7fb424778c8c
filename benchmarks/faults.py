"""Faults survived, with figures: real training runs on the tiny model, hurt, then audited.

    .venv/bin/python benchmarks/faults.py [--only driver_kills,load] [--kills 10]

Scenarios (tests/faults/scenarios.py; the fast ones also run in tests/faults):
  - the driver SIGKILLed at --kills moments drawn by --seed (before the first step, during
    a step, during a checkpoint write, while groups are buffered), ``--resume`` after each;
    each moment is a point the run marks (an event, a file, a held write), not an offset;
  - the learner child SIGKILLed mid-step; SIGINT twice (the second as soon as the first
    is taken, and once the driver said it is stopping);
  - a sandbox kernel, then a whole sandbox (bwrap), SIGKILLed under running episodes;
  - the search HTTP service down until an episode felt it;
  - a full disk at a checkpoint write (a 60 MB tmpfs: mounting needs root);
  - a corrupt latest checkpoint (torn weights);
  - load: 100 and 1,000 concurrent episodes with a 1 s tool.
Each run is audited afterwards: steps completed, samples trained once each, orphans (ps by
process group; sandboxes by command line), checkpoint loadable. Prints a table and writes
benchmarks/results/faults.json; the machine's load average is recorded (a shared box
stretches every time here).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.faults import scenarios  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


# --- load: a measurement, not a fault (kept here: it samples the run on a clock) ---


def _tree_usage(pgid: int) -> tuple[int, int]:
    """(RSS bytes, open fds) summed over the live processes of a process group."""
    from tests.faults.harness import group_members

    rss = fds = 0
    for pid in group_members(pgid):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1]) * 1024
            fds += len(list(Path(f"/proc/{pid}/fd").iterdir()))
        except OSError:
            continue
    return rss, fds


def load(run_dir: Path, episodes: int, group_size: int = 4) -> dict[str, Any]:
    """`episodes` concurrent episodes (one synchronous step's worth), each with a 1 s tool
    call, on the tiny model: peak RSS and open fds of the run's processes, episodes
    finished, throughput."""
    groups = episodes // group_size
    proc = scenarios.start_driver(
        run_dir,
        2,
        *scenarios.FORCED,
        "env.options.tool=sleep",
        "env.options.busy_s=1.0",
        f"rollout.group_size={group_size}",
        f"rollout.concurrency={episodes}",
        f"learner.batch_groups={groups}",
        "learner.micro_batch_size=64",
        "sampler.max_batch_size=256",
        "orchestrator.max_staleness=0",
        "orchestrator.checkpoint_every=0",
        "rollout.episode_timeout_s=600",
    )
    peak_rss = peak_fds = 0
    while proc.poll() is None:
        rss, fds = _tree_usage(proc.pid)
        peak_rss, peak_fds = max(peak_rss, rss), max(peak_fds, fds)
        time.sleep(0.2)  # the sampling period of the peaks
    ok, orphans = scenarios._finish(run_dir, proc)
    rows = scenarios.read_events(run_dir)
    finished = [r for r in rows if r["event"] == "GroupFinished"]
    started = next(r["time"] for r in rows if r["event"] == "RunStarted")
    # synchronous: the first step's groups are the first `groups` to finish
    rollout_s = finished[groups - 1]["time"] - started if len(finished) >= groups else None
    hits = scenarios._infra_hits(run_dir)
    return {
        "scenario": f"load: {episodes} concurrent episodes, 1 s tool",
        "episodes_concurrent": episodes,
        "runs": 1,
        "survived": ok,
        "episodes_expected": 2 * groups * group_size,
        "episodes_finished": hits["episodes"],
        "episodes_infra_error": hits["episodes_infra_error"],
        "groups_finished": len(finished),
        "first_batch_rollout_s": round(rollout_s, 1) if rollout_s else None,
        "episodes_per_s": round(groups * group_size / rollout_s, 1) if rollout_s else None,
        "peak_rss_mb": round(peak_rss / 2**20),
        "peak_open_fds": peak_fds,
        "orphans": orphans,
        "error": "" if ok else scenarios.driver_log(run_dir)[-2000:],
    }


def _moments(n: int, seed: int) -> list[str]:
    """`n` kill moments: each kind at least once (the first before any step), the rest
    drawn at random."""
    rng = random.Random(seed)
    rest = [rng.choice(scenarios.MOMENTS[1:]) for _ in range(max(n - 4, 0))]
    middle = list(scenarios.MOMENTS[1:]) + rest
    rng.shuffle(middle)
    return ["before_first_step", *middle][:n]


def run(only: set[str] | None, kills: int, seed: int) -> dict[str, Any]:
    plan = {
        "driver_kills": lambda d: scenarios.driver_kills(
            d, _moments(kills, seed), max_steps=kills + 4, seed=seed
        ),
        "learner_kill": lambda d: scenarios.learner_kill(d, max_steps=5, seed=seed),
        "sigint_twice": lambda d: scenarios.sigint_twice(d, max_steps=4, second="at_once"),
        "sigint_twice_slow": lambda d: scenarios.sigint_twice(d, max_steps=4, second="after_ack"),
        "sandbox_kill": lambda d: scenarios.sandbox_kernel_kill(d, max_steps=3, kills=2),
        "search_down": lambda d: scenarios.search_down(d, max_steps=4, felt=1),
        "full_disk": lambda d: scenarios.full_disk(d, max_steps=3),
        "corrupt_latest": lambda d: scenarios.corrupt_latest(d, max_steps=4),
        "load_100": lambda d: load(d, 100),
        "load_1000": lambda d: load(d, 1000),
    }
    out: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_before": os.getloadavg(),
        },
        "scenarios": {},
    }
    for name, fn in plan.items():
        if only and name not in only:
            continue
        t0 = time.time()
        with tempfile.TemporaryDirectory(prefix=f"faults-{name}-") as d:
            try:
                result = fn(Path(d) / "run")
            except Exception as e:  # a scenario that breaks is a result too
                result = {"scenario": name, "survived": False, "error": repr(e)[:2000]}
        result["seconds"] = round(time.time() - t0, 1)
        out["scenarios"][name] = result
        print(f"{name}: {json.dumps(result)[:600]}", flush=True)
    out["machine"]["loadavg_after"] = os.getloadavg()
    out["totals"] = totals(out["scenarios"])
    return out


def totals(results: dict[str, Any]) -> dict[str, Any]:
    faults = [r for k, r in results.items() if not k.startswith("load") and "skipped" not in r]
    return {
        "scenarios": len(faults),
        "runs": sum(r.get("runs", 0) for r in faults),
        "survived": sum(bool(r.get("survived")) for r in faults),
        "kills": sum(r.get("kills", 0) for r in faults),
        "steps_lost": sum(r.get("steps_lost", 0) for r in faults),
        "trained_twice": sum(r.get("trained_twice", 0) for r in faults),
        "orphans": sum(r.get("orphans", 0) for r in results.values()),
    }


def print_table(out: dict[str, Any]) -> None:
    cols = ("scenario", "runs", "survived", "steps_lost", "trained_twice", "orphans", "seconds")
    print(" | ".join(cols))
    for r in out["scenarios"].values():
        print(" | ".join(str(r.get(c, "")) for c in cols))
    for key in ("load_100", "load_1000"):
        r = out["scenarios"].get(key)
        if r and "peak_rss_mb" in r:
            print(
                f"{r['scenario']}: {r['episodes_finished']}/{r['episodes_expected']} episodes, "
                f"{r['episodes_per_s']} episodes/s, peak RSS {r['peak_rss_mb']} MB, "
                f"peak fds {r['peak_open_fds']}"
            )
    print("totals:", json.dumps(out["totals"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated scenario names")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    only = {s for s in args.only.split(",") if s} or None
    out = run(only, args.kills, args.seed)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "faults.json"
    if only and path.exists():  # a partial run updates the scenarios it ran
        previous = json.loads(path.read_text())
        previous["scenarios"].update(out["scenarios"])
        previous["totals"] = totals(previous["scenarios"])
        previous["machine"] = out["machine"]
        out = previous
    path.write_text(json.dumps(out, indent=2) + "\n")
    print_table(out)


if __name__ == "__main__":
    main()
