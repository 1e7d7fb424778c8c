"""`make demo-code`: held-out pass rate of a config's model before and after training.

Three `agentrl` commands, so the demo runs exactly what a user runs:

    agentrl eval  CONFIG -n N -k K                 # the base model on held-out tasks
    agentrl train CONFIG --run-dir RUN
    agentrl eval  CONFIG --checkpoint RUN -n N -k K

and one JSON with both evaluations, the training time and the machine (``--out``).

    python scripts/demo_code.py                                  # configs/demo_code.yaml
    python scripts/demo_code.py --set orchestrator.max_steps=2   # overrides for all three
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def agentrl(*args: str) -> None:
    """One `agentrl` command in this interpreter; its failure stops the demo."""
    cmd = [sys.executable, "-m", "agentrl.cli", *args]
    print("+ agentrl " + " ".join(args), flush=True)
    done = subprocess.run(cmd, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"agentrl {args[0]} failed (exit {done.returncode})")


def pass_rate(result: dict[str, Any]) -> float:
    return float(result["metrics"].get("pass@1", 0.0))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo_code.yaml")
    parser.add_argument("--run-dir", default="runs/demo_code")
    parser.add_argument(
        "--out", default=None, help="the result JSON (default RUN_DIR/demo_code.json)"
    )
    parser.add_argument("-n", "--eval-tasks", type=int, default=32, help="held-out tasks")
    parser.add_argument("-k", "--eval-samples", type=int, default=4, help="samples per task")
    parser.add_argument(
        "--set", action="append", default=[], help="section.key=value, all commands"
    )
    args = parser.parse_args(argv)

    run_dir = Path(args.run_dir).resolve()
    if run_dir.exists() and any(run_dir.iterdir()):
        raise SystemExit(f"{run_dir} is not empty: pass another --run-dir or remove it")
    run_dir.mkdir(parents=True, exist_ok=True)
    sets = [x for s in args.set for x in ("--set", s)]
    evals = ["-n", str(args.eval_tasks), "-k", str(args.eval_samples), *sets]
    start = time.time()
    agentrl("eval", args.config, *evals, "--out", str(run_dir / "eval_before.json"))
    t_train = time.time()
    agentrl("train", args.config, "--run-dir", str(run_dir), "--no-summary", *sets)
    train_s = time.time() - t_train
    agentrl(
        "eval",
        args.config,
        "--checkpoint",
        str(run_dir),
        *evals,
        "--out",
        str(run_dir / "eval_after.json"),
    )
    before = json.loads((run_dir / "eval_before.json").read_text())
    after = json.loads((run_dir / "eval_after.json").read_text())
    result = {
        "config": args.config,
        "overrides": args.set,
        "held_out_tasks": before["tasks"],
        "samples_per_task": before["samples_per_task"],
        "pass@1_before": pass_rate(before),
        "pass@1_after": pass_rate(after),
        "before": before,
        "after": after,
        "train_minutes": round(train_s / 60, 2),
        "total_minutes": round((time.time() - start) / 60, 2),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
    }
    out = Path(args.out) if args.out else run_dir / "demo_code.json"
    out.write_text(json.dumps(result, indent=1))
    print(
        f"held-out pass@1: {result['pass@1_before']:.3f} -> {result['pass@1_after']:.3f} "
        f"({result['held_out_tasks']} tasks x {result['samples_per_task']}; "
        f"{result['total_minutes']} min in all) -> {out}"
    )
    return result


if __name__ == "__main__":
    main()
