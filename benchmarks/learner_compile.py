"""Learner steps with eager vs compiled decoder layers (``learner.compile``) on this CPU.

    .venv/bin/python benchmarks/learner_compile.py [--model smollm2-135m-instruct | tiny-llama]
        [--steps 3] [--bf16 auto|on|off] [--micro 4] [--threads N]

Same workload as benchmarks/learner_step.py (8 sequences x 256 tokens: 64 prompt + 192
model, GRPO, random tokens), one process, eager first (``learner.compile=off``), then
compiled (``learner.compile=on``: inductor's C++ backend). The first step of each is
reported apart (with compiled layers it is the compile), the others as best and median.
Fused log-probs are off in both, so only the decoder layers differ. Prints a table and
writes benchmarks/results/learner_compile[_<model>].json. On CUDA the same comparison is
benchmarks/gpu.py's learner section.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.learner_step import make_groups  # noqa: E402


def run_mode(args: argparse.Namespace, mode: str) -> dict:
    from agentrl.config import config_from_dict
    from agentrl.learner import Learner
    from agentrl.models import load_model
    from agentrl.run.settings import resolve

    model, tok = load_model(args.model, dtype="float32")
    cfg = config_from_dict(
        {
            "learner": {
                "lr": 1e-6,
                "micro_batch_size": args.micro,
                "bf16": args.bf16,
                "fused_logprobs": "off",
                "compile": mode,
                "share_prompt": False,  # compiled layers turn it off; the same for both
                "device": "cpu",
            }
        }
    )
    learner = Learner(model, tok, resolve(cfg).learner)
    groups = make_groups(2, 4, 64, 192, model.config.vocab_size)
    t0 = time.perf_counter()
    first = learner.step(groups)
    first_s = time.perf_counter() - t0
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        learner.step(groups)
        times.append(time.perf_counter() - t0)
    return {
        "compile": mode,
        "compiled_layers": learner.compiled_layers,
        "first_step_s": first_s,
        "step_s": times,
        "best_s": min(times),
        "median_s": statistics.median(times),
        "tokens_per_step": first["tokens/total"],
        "grad_norm_first": first["grad_norm"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--steps", type=int, default=3, help="timed steps after the first")
    ap.add_argument("--bf16", default="auto", choices=["auto", "on", "off"])
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    rows = [run_mode(args, mode) for mode in ("off", "on")]
    eager, compiled = rows
    result = {
        "model": args.model,
        "bf16": args.bf16,
        "micro_batch_size": args.micro,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "load_average_start": list(load_start),
        "load_average_end": list(os.getloadavg()),
        "rows": rows,
        "compiled_vs_eager_best": eager["best_s"] / compiled["best_s"],
        "compiled_vs_eager_median": eager["median_s"] / compiled["median_s"],
    }
    print(f"\nlearner steps, {args.model}, {rows[0]['tokens_per_step']:.0f} tokens a step")
    print("| layers | first step | best step | median step |")
    print("|---|---|---|---|")
    for r in rows:
        print(
            f"| {'compiled' if r['compile'] == 'on' else 'eager'} | {r['first_step_s']:.2f} s "
            f"| {r['best_s']:.2f} s | {r['median_s']:.2f} s |"
        )
    print(
        f"compiled / eager speed: {result['compiled_vs_eager_best']:.2f}x best, "
        f"{result['compiled_vs_eager_median']:.2f}x median (load average "
        f"{load_start[0]:.1f} -> {result['load_average_end'][0]:.1f})"
    )
    suffix = "" if args.model == "smollm2-135m-instruct" else f"_{args.model}"
    out = ROOT / "benchmarks" / "results" / f"learner_compile{suffix}.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
