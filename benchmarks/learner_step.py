"""Time learner steps, side by side per C-allocator mode and log-prob kernel, beside a plain
HF step; or (``--packing``) packed vs padded micro-batches on sequences of varied length.

    .venv/bin/python benchmarks/learner_step.py [--model smollm2-135m-instruct | tiny-llama]
        [--steps 3] [--bf16 auto|on|off] [--micro 4] [--threads N] [--no-baseline]
        [--allocators reuse system] [--fused auto off]
    .venv/bin/python benchmarks/learner_step.py --packing [--model ...] [--steps 5]
    .venv/bin/python benchmarks/learner_step.py --mfu [--model ...] [--steps 3]

``--mfu``: the learner's achieved model GFLOP/s (benchmarks/flops.py) in float32 and in
bf16 autocast (float32 on a CPU without bf16 instructions), each beside the matmul peak
measured by the same process right after its steps (same threads, same machine load) in
the dtype its GEMMs run in, and its peak RSS; writes
benchmarks/results/learner_step_mfu.json.

``--packing``: 8 sequences of 64 prompt + 32..448 model tokens (uniform, seeded), so
micro-batches sorted by length still carry padding; ``learner.packing`` off and on each in
its own subprocess (allocator reuse, fused log-probs auto, share_prompt off), in
alternating order per repeat. Reports real tokens per second, the padding fraction of the
padded micro-batches and the packed/padded ratio; writes
benchmarks/results/learner_step_packing[_<model>].json.

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


def make_groups(
    n_groups: int,
    group_size: int,
    prompt: int,
    response: int | tuple[int, int],
    vocab: int,
):
    """Groups of random tokens; ``response`` a length, or a (min, max) range drawn from."""
    from agentrl.types import Segment, Trajectory, TrajectoryGroup

    rng = random.Random(0)
    groups = []
    for g in range(n_groups):
        trajs = []
        for i in range(group_size):
            p = [rng.randrange(3, vocab) for _ in range(prompt)]
            n = response if isinstance(response, int) else rng.randint(*response)
            r = [rng.randrange(3, vocab) for _ in range(n)]
            trajs.append(
                Trajectory(
                    segments=[
                        Segment("prompt", p),
                        Segment("model", r, logprobs=[-10.0] * n, versions=[0] * n),
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
    from agentrl.run.settings import resolve

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
    learner = Learner(model, tok, resolve(cfg).learner)
    groups = make_groups(2, 4, 64, 192, model.config.vocab_size)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        m = learner.step(groups)
        times.append(time.perf_counter() - t0)
    t_pub = time.perf_counter()
    learner.state_dict_for_sampler()
    publish_s = time.perf_counter() - t_pub
    # CPU MFU: the step's model FLOPs per second beside this process's measured matmul
    # peak in the learner's compute dtype (benchmarks/flops.py)
    from benchmarks.flops import matmul_peak_gflops, step_flops

    passes = int(m["time/no_grad_pass_s"] > 1e-3)  # the start-of-step pass ran
    gflop = step_flops(model.config, [256] * 8, [192] * 8, no_grad_passes=passes) / 1e9
    # the peak of the GEMMs the step runs
    bf16_gemms = learner.bf16
    peak_rss_mb = _peak_rss_mb()
    peak = matmul_peak_gflops(torch.bfloat16 if bf16_gemms else torch.float32)
    return {
        "model_gflop_per_step": gflop,
        "achieved_gflops": gflop / min(times),
        "matmul_peak_gflops": peak,
        "mfu": gflop / min(times) / peak,
        "allocator": args.child,
        "fused_logprobs": args.fused[0],
        "bf16": learner.bf16,
        "peak_dtype": "bfloat16" if bf16_gemms else "float32",
        "peak_rss_mb": peak_rss_mb,
        "threads": torch.get_num_threads(),
        "step_s": times,
        "step_s_best": min(times),
        "no_grad_pass_s": m["time/no_grad_pass_s"],
        "state_dict_for_sampler_s": publish_s,
        "plain_hf_step_s": baseline_s,
    }


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


VARIED = (32, 448)  # --packing: model tokens per sequence, uniform


def packing_child(args: argparse.Namespace) -> dict:
    """``learner.packing`` = args.packing_child in this process, on the varied workload."""
    sys.path.insert(0, str(ROOT))
    from agentrl.config import config_from_dict
    from agentrl.cpu import set_allocator
    from agentrl.learner import Learner
    from agentrl.models import load_model
    from agentrl.run.settings import resolve
    from agentrl.types import Batch

    set_allocator("reuse")
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model(args.model, dtype="float32")
    packing = args.packing_child == "on"
    cfg = config_from_dict(
        {
            "learner": {
                "lr": 1e-6,
                "micro_batch_size": args.micro,
                "bf16": args.bf16,
                "packing": packing,
                "share_prompt": False,
            },
            "algorithm": {"off_policy": args.correction},
        }
    )
    learner = Learner(model, tok, resolve(cfg).learner)
    groups = make_groups(2, 4, 64, VARIED, model.config.vocab_size)
    batch = Batch.from_groups(groups)
    layout = learner.layout(batch)
    real = int(layout.lengths.sum())
    padded = sum(len(idx) * L for idx, L, _ in layout.micro_batches(torch.arange(batch.size)))
    learner.warmup()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        learner.step(groups)
        times.append(time.perf_counter() - t0)
    return {
        "packing": packing,
        "bf16": learner.bf16,
        "threads": torch.get_num_threads(),
        "step_s": times,
        "real_tokens": real,
        "padded_tokens": padded,
        "padding_fraction": 1 - real / padded,
    }


def packing_main(args: argparse.Namespace) -> None:
    load_before = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for rep in range(args.repeats):
        for mode in ("off", "on") if rep % 2 == 0 else ("on", "off"):
            cmd = [sys.executable, __file__, "--packing-child", mode, "--model", args.model]
            cmd += ["--steps", str(args.steps), "--bf16", args.bf16, "--micro", str(args.micro)]
            cmd += ["--correction", args.correction, "--threads", str(args.threads)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    rows = []
    for mode in ("off", "on"):
        r = runs[mode]
        steps = sorted(t for run in r for t in run["step_s"])
        best, median = steps[0], steps[len(steps) // 2]
        rows.append(
            {
                "packing": mode == "on",
                "step_s": [run["step_s"] for run in r],
                "step_s_best": best,
                "step_s_median": median,
                "tokens_per_s_best": r[0]["real_tokens"] / best,
                "tokens_per_s_median": r[0]["real_tokens"] / median,
                "real_tokens": r[0]["real_tokens"],
                "forwarded_tokens": r[0]["real_tokens"] if mode == "on" else r[0]["padded_tokens"],
                "padding_fraction": 0.0 if mode == "on" else r[0]["padding_fraction"],
                "bf16": r[0]["bf16"],
                "threads": r[0]["threads"],
            }
        )
    ratio_best = rows[1]["tokens_per_s_best"] / rows[0]["tokens_per_s_best"]
    ratio_median = rows[1]["tokens_per_s_median"] / rows[0]["tokens_per_s_median"]
    print(
        f"{args.model}: 8 sequences, 64 prompt + {VARIED[0]}..{VARIED[1]} model tokens, "
        f"micro {args.micro}, {args.repeats} x {args.steps} steps per mode"
    )
    print(
        f"{'packing':<9}{'padding':>9}{'tokens fwd':>12}{'best step (s)':>15}"
        f"{'median (s)':>12}{'tokens/s best':>15}{'tokens/s median':>17}"
    )
    for r in rows:
        print(
            f"{'on' if r['packing'] else 'off':<9}{r['padding_fraction']:>9.1%}"
            f"{r['forwarded_tokens']:>12}{r['step_s_best']:>15.2f}{r['step_s_median']:>12.2f}"
            f"{r['tokens_per_s_best']:>15.0f}{r['tokens_per_s_median']:>17.0f}"
        )
    print(f"packed / padded tokens/s: best {ratio_best:.2f}x, median {ratio_median:.2f}x")
    result = {
        "model": args.model,
        "sequences": 8,
        "prompt_tokens": 64,
        "model_tokens_range": list(VARIED),
        "micro_batch_size": args.micro,
        "correction": args.correction,
        "rows": rows,
        "ratio_tokens_per_s_best": ratio_best,
        "ratio_tokens_per_s_median": ratio_median,
        "cpu_count": os.cpu_count(),
        "loadavg_1m_before_after": [load_before, os.getloadavg()[0]],
    }
    default = args.model == "smollm2-135m-instruct"
    name = "learner_step_packing.json" if default else f"learner_step_packing_{args.model}.json"
    out_path = Path(__file__).parent / "results" / name
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2))
    print(f"wrote {out_path}")


def mfu_main(args: argparse.Namespace) -> None:
    """The learner's achieved model GFLOP/s in float32 and bf16 autocast, each beside the
    matmul peak its own process measured right after its steps (same threads, same load)."""
    load_before = os.getloadavg()[0]
    rows = []
    for bf16 in ("off", "on"):
        cmd = [sys.executable, __file__, "--child", "reuse", "--fused", "auto"]
        cmd += ["--model", args.model, "--steps", str(args.steps), "--bf16", bf16]
        cmd += ["--micro", str(args.micro), "--correction", args.correction]
        cmd += ["--threads", str(args.threads)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{args.model}: 8 x 256 tokens (192 trained), micro {args.micro}, MFU")
    print(
        f"{'dtype':<8}{'threads':>8}{'best step (s)':>15}{'GFLOP/step':>12}"
        f"{'GFLOP/s':>10}{'matmul peak GFLOP/s':>21}{'MFU':>7}{'peak RSS MB':>13}"
    )
    for r in rows:
        print(
            f"{'bf16' if r['bf16'] else 'fp32':<8}{r['threads']:>8}"
            f"{r['step_s_best']:>15.2f}{r['model_gflop_per_step']:>12.0f}"
            f"{r['achieved_gflops']:>10.1f}{r['matmul_peak_gflops']:>13.1f} {r['peak_dtype']:<7}"
            f"{r['mfu']:>7.0%}{r['peak_rss_mb']:>13.0f}"
        )
    result = {
        "model": args.model,
        "sequences": 8,
        "tokens_per_sequence": 256,
        "trained_tokens_per_sequence": 192,
        "flops": "benchmarks/flops.py: 2 per MAC, backward 2x forward, causal attention, "
        "LM head on trained positions only; embeddings and element-wise work not counted",
        "rows": rows,
        "cpu_count": os.cpu_count(),
        "loadavg_1m_before_after": [load_before, os.getloadavg()[0]],
    }
    default = args.model == "smollm2-135m-instruct"
    name = "learner_step_mfu.json" if default else f"learner_step_mfu_{args.model}.json"
    out_path = Path(__file__).parent / "results" / name
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2))
    print(f"wrote {out_path}")


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
    ap.add_argument(
        "--packing", action="store_true", help="packed vs padded on sequences of varied length"
    )
    ap.add_argument("--repeats", type=int, default=2, help="--packing: subprocesses per mode")
    ap.add_argument(
        "--mfu",
        action="store_true",
        help="CPU MFU: fp32 and bf16 steps (allocator reuse, fused auto) beside the matmul peak",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--packing-child", choices=["off", "on"], help=argparse.SUPPRESS)
    ap.add_argument("--baseline", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    if args.packing_child:
        print(json.dumps(packing_child(args)))
        return
    if args.packing:
        packing_main(args)
        return

    if args.mfu:
        mfu_main(args)
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
        f"{'all steps (s)':>30}{'GFLOP/s':>9}{'matmul peak':>13}{'MFU':>6}"
    )
    for r in rows:
        steps = ", ".join(f"{t:.2f}" for t in r["step_s"])
        print(
            f"{r['allocator']:<12}{r['fused_logprobs']:>7}{r['bf16']!s:>6}{r['threads']:>9}"
            f"{r['step_s_best']:>15.2f}{steps:>30}{r['achieved_gflops']:>9.1f}"
            f"{r['matmul_peak_gflops']:>13.1f}{r['mfu']:>6.0%}"
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
