"""Time learner steps, side by side per C-allocator mode and log-prob kernel, beside a plain
HF step.

    .venv/bin/python benchmarks/learner_step.py [--model smollm2-135m-instruct | tiny-llama]
        [--steps 3] [--bf16 auto|on|off] [--micro 4] [--threads N] [--no-baseline]
        [--allocators reuse system] [--fused auto off]

Workload: 8 sequences x 256 tokens (64 prompt + 192 model), GRPO. Each (allocator mode
(``orchestrator.cpu_allocator``, see ``agentrl.cpu``), ``learner.fused_logprobs`` mode)
runs in its own subprocess, since the allocator mode is process-wide. The first step of a
``fused=auto`` run includes compiling the kernels (cached on disk afterwards); the table's
"best step" is the fastest of ``--steps``. The plain HF step (full ``[B, T, V]`` logits, ``model(labels=...)`` +
backward + AdamW) runs in the first subprocess. Prints a table and writes
benchmarks/results/learner_step.json (learner_step_<model>.json for other models).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def make_groups(n_groups: int, group_size: int, prompt: int, response: int, vocab: int):
    from agentrl.types import Segment, Trajectory, TrajectoryGroup

    rng = random.Random(0)
    groups = []
    for g in range(n_groups):
        trajs = []
        for i in range(group_size):
            p = [rng.randrange(3, vocab) for _ in range(prompt)]
            r = [rng.randrange(3, vocab) for _ in range(response)]
            trajs.append(
                Trajectory(
                    segments=[
                        Segment("prompt", p),
                        Segment("model", r, logprobs=[-10.0] * response, versions=[0] * response),
                    ],
                    reward=float(i % 2),
                    traj_id=f"{g}-{i}",
                )
            )
        groups.append(TrajectoryGroup(task_id=str(g), trajectories=trajs))
    return groups


def child(args: argparse.Namespace) -> dict:
    """One allocator mode in this process: learner steps (and the plain HF step)."""
    sys.path.insert(0, str(ROOT))
    from agentrl.config import config_from_dict
    from agentrl.cpu import set_allocator
    from agentrl.learner import Learner
    from agentrl.models import load_model

    set_allocator(args.child)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model(args.model, dtype="float32")
    cfg = config_from_dict(
        {
            "learner": {
                "lr": 1e-6,
                "micro_batch_size": args.micro,
                "bf16": args.bf16,
                "fused_logprobs": args.fused[0],
            },
            "algorithm": {"off_policy": args.correction},
        }
    )
    baseline_s = None
    if args.baseline:
        ids = torch.randint(3, model.config.vocab_size, (8, 256))
        opt = torch.optim.AdamW(model.parameters(), lr=0.0)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16 != "off"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        baseline_s = time.perf_counter() - t0
        del opt
    learner = Learner(model, tok, cfg)
    groups = make_groups(2, 4, 64, 192, model.config.vocab_size)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        m = learner.step(groups)
        times.append(time.perf_counter() - t0)
    t_pub = time.perf_counter()
    learner.state_dict_for_sampler()
    return {
        "allocator": args.child,
        "fused_logprobs": args.fused[0],
        "bf16": learner.bf16,
        "threads": torch.get_num_threads(),
        "step_s": times,
        "step_s_best": min(times),
        "no_grad_pass_s": m["time/no_grad_pass_s"],
        "state_dict_for_sampler_s": time.perf_counter() - t_pub,
        "plain_hf_step_s": baseline_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--bf16", default="auto", choices=["auto", "on", "off"])
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--correction", default="none", choices=["none", "tis", "decoupled"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the plain HF step")
    ap.add_argument("--allocators", nargs="+", default=["reuse", "system"])
    ap.add_argument(
        "--fused",
        nargs="+",
        default=["auto", "off"],
        choices=["auto", "on", "off"],
        help="learner.fused_logprobs modes (compiled log-softmax passes); each allocator runs each",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--baseline", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return

    load_before = os.getloadavg()[0]
    rows = []
    combos = [(a, f) for a in args.allocators for f in args.fused]
    for i, (mode, fused) in enumerate(combos):
        cmd = [sys.executable, __file__, "--child", mode, "--fused", fused, "--model", args.model]
        cmd += ["--steps", str(args.steps), "--bf16", args.bf16, "--micro", str(args.micro)]
        cmd += ["--correction", args.correction, "--threads", str(args.threads)]
        if i == 0 and not args.no_baseline:
            cmd.append("--baseline")
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))

    print(f"{args.model}: 8 x 256 tokens, micro {args.micro}, correction {args.correction}")
    print(
        f"{'allocator':<12}{'fused':>7}{'bf16':>6}{'threads':>9}{'best step (s)':>15}"
        f"{'all steps (s)':>30}"
    )
    for r in rows:
        steps = ", ".join(f"{t:.2f}" for t in r["step_s"])
        print(
            f"{r['allocator']:<12}{r['fused_logprobs']:>7}{r['bf16']!s:>6}{r['threads']:>9}"
            f"{r['step_s_best']:>15.2f}{steps:>30}"
        )
    base = next((r["plain_hf_step_s"] for r in rows if r["plain_hf_step_s"]), None)
    if base is not None:
        print(f"{'plain HF fwd+bwd+AdamW (full logits), ' + rows[0]['allocator']:<42}{base:>10.2f}")
    result = {
        "model": args.model,
        "sequences": 8,
        "tokens_per_sequence": 256,
        "micro_batch_size": args.micro,
        "correction": args.correction,
        "rows": rows,
        # this machine is shared: 1-minute load average (cores: os.cpu_count())
        "cpu_count": os.cpu_count(),
        "loadavg_1m_before_after": [load_before, os.getloadavg()[0]],
    }
    default = args.model == "smollm2-135m-instruct"
    name = "learner_step.json" if default else f"learner_step_{args.model}.json"
    out_path = Path(__file__).parent / "results" / name
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
