"""On-policy distillation against GRPO alone at equal compute: SmolLM2-135M on code_math.

1. The teacher: SmolLM2-135M trained with GRPO for ``--teacher-steps`` steps on
   configs/demo.yaml, exported as a model folder (or ``--teacher FOLDER``: any model folder
   with SmolLM2's tokenizer, e.g. an ``agentrl sft`` output).
2. Per seed, two students from the same base model, the same steps, samples and groups:
   ``grpo`` (the task reward alone) and ``distill`` (``distill.teacher``: the teacher's
   per-token reverse KL, mixed with the task reward's advantage by ``distill.reward_weight``).
   Dynamic sampling is off for both (a group of equal rewards still carries the teacher's
   signal, and equal steps must mean equal samples).
3. Each student's last checkpoint on held-out tasks (``agentrl eval``: pass@1).

Writes ``<out>/distill_vs_grpo.json`` after every run (a cut-off run keeps the finished
ones) and prints mean and spread over the seeds: held-out pass@1, training minutes (the
teacher's forward is distillation's extra compute), the last step's reverse KL.

    python benchmarks/distill_vs_grpo.py --out runs/distill_bench            # 3 seeds
    python benchmarks/distill_vs_grpo.py --quick --out /tmp/distill_quick      # tiny models, a smoke run

On 2 shared CPU cores a full run (teacher 20 steps, 6 students x 12 steps, 6 evaluations) is
several hours; run it with ``nice -n 10``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CONFIG = "configs/demo.yaml"
COMMON = ["algorithm.dynamic_sampling=false", "orchestrator.time_limit_s=null",
          "orchestrator.checkpoint_every=0", "logging.progress=false"]  # fmt: skip
QUICK = ["model.name=tiny-llama", "model.dtype=float32", "sampler.max_new_tokens=8",
         "rollout.group_size=4", "rollout.max_turns=1", "learner.lr=1e-3"]  # fmt: skip


def agentrl(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "agentrl.cli", *args], cwd=REPO, check=True)


def sets(overrides: list[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def last_metric(run_dir: Path, key: str) -> float:
    from agentrl.run.plotting import read_steps

    steps = read_steps(run_dir)
    return float(steps[-1].get(key, math.nan)) if steps else math.nan


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--teacher", type=Path, help="a model folder (skips training one)")
    p.add_argument("--teacher-steps", type=int, default=20)
    p.add_argument("--steps", type=int, default=12, help="student steps (both methods)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--reward-weight", type=float, default=1.0)
    p.add_argument("--eval-tasks", type=int, default=32)
    p.add_argument("--eval-samples", type=int, default=4)
    p.add_argument("--quick", action="store_true", help="tiny random models: a smoke run")
    p.add_argument("--set", action="append", default=[], help="more overrides for every run")
    args = p.parse_args()
    base = COMMON + (QUICK if args.quick else []) + args.set
    args.out.mkdir(parents=True, exist_ok=True)
    teacher = args.teacher
    if teacher is None:
        run = args.out / "teacher-run"
        teacher = args.out / "teacher"
        if not teacher.is_dir():
            agentrl("train", CONFIG, "--run-dir", str(run), "--no-summary",
                    *sets([*base, f"orchestrator.max_steps={args.teacher_steps}"]))  # fmt: skip
            agentrl("export", str(run), str(teacher))
    methods = {
        "grpo": [],
        "distill": [f"distill.teacher={teacher}", f"distill.reward_weight={args.reward_weight}"],
    }
    results_path = args.out / "distill_vs_grpo.json"
    runs: list[dict[str, Any]] = []
    for seed in args.seeds:
        for method, extra in methods.items():
            run_dir = args.out / f"{method}-seed{seed}"
            overrides = [*base, *extra, f"orchestrator.seed={seed}",
                         f"orchestrator.max_steps={args.steps}"]  # fmt: skip
            t0 = time.time()
            agentrl("train", CONFIG, "--run-dir", str(run_dir), "--no-summary", *sets(overrides))
            minutes = (time.time() - t0) / 60
            scores = run_dir / "heldout.json"
            agentrl("eval", CONFIG, "--checkpoint", str(run_dir), "-n", str(args.eval_tasks),
                    "-k", str(args.eval_samples), "--out", str(scores), *sets(base))  # fmt: skip
            result = json.loads(scores.read_text())
            runs.append({
                "method": method, "seed": seed, "steps": args.steps, "minutes": minutes,
                "heldout_pass@1": result["metrics"]["pass@1"],
                "last_reverse_kl": last_metric(run_dir, "distill/reverse_kl"),
                "last_reward_mean": last_metric(run_dir, "reward/mean"),
            })  # fmt: skip
            summary = summarise(runs)
            results_path.write_text(json.dumps(
                {"teacher": str(teacher), "config": CONFIG, "overrides": base, "runs": runs,
                 "summary": summary}, indent=1))  # fmt: skip
    for method, stats in summarise(runs).items():
        line = ", ".join(f"{k} {v['mean']:.3f} ± {v['std']:.3f}" for k, v in stats.items())
        print(f"{method:8s} {line}")
    print(f"wrote {results_path}")


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for method in dict.fromkeys(r["method"] for r in runs):
        rows = [r for r in runs if r["method"] == method]
        out[method] = {}
        for key in ("heldout_pass@1", "minutes", "last_reward_mean", "last_reverse_kl"):
            xs = [float(r[key]) for r in rows if not math.isnan(float(r[key]))]
            out[method][key] = {
                "mean": statistics.fmean(xs) if xs else math.nan,
                "std": statistics.pstdev(xs) if len(xs) > 1 else 0.0,
                "n": float(len(xs)),
            }
    return out


if __name__ == "__main__":
    main()
