"""What is resident in a training process, stage by stage (SmolLM2-135M by default).

One subprocess per (sampler dtype, publish mode), laid out as a synchronous run with the
thread learner (one process, ``orchestrator.cpu_allocator: reuse``): imports, the sampler's
model copy, the learner's float32 masters, the compiled log-prob kernels, a step on the
vs_trl workload (2 groups x 8 samples, 46 prompt + 64 model tokens: AdamW state, gradients,
activations), a publish into the sampler's weights, a second step. Each stage reports the
process's RSS / PSS and its growth, beside the bytes of the tensors it created. Publish
modes: ``copy`` (``Learner.state_dict_for_sampler``: a full CPU copy of the float32
weights, as the orchestrator did before) and ``live`` (``Learner.sampler_weights``: views
of the live weights copied straight into the sampler's, what it does now).

    .venv/bin/python benchmarks/memory.py [--model smollm2-135m-instruct | tiny-llama]

Prints a table and writes benchmarks/results/memory.json (memory_<model>.json otherwise).

``--learner-variants`` measures the learner alone instead, one subprocess per variant, on
the vs_trl workload as the learner sees it (2 groups x 8 samples sharing their 46-token
prompt, 64 model tokens, ``micro_batch_size`` 16, fp32, reuse allocator, 2 threads): peak
RSS (VmHWM) and RSS after each of 3 steps, and each step's seconds. Variants: ``lazy``
(AdamW's state made inside the first step, as torch does: the learner's behaviour),
``eager`` (the state made before the first step, in case the lazy moments fill the first
step's activation holes: measured, it does not lower the peak), and, on top of ``eager``,
``gc`` (+ ``model.gradient_checkpointing``) and ``mb4`` (``learner.micro_batch_size: 4``).
Writes benchmarks/results/memory_learner_variants.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def rss_pss() -> tuple[float, float]:
    vals = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        parts = line.split()
        if parts[0] in ("Rss:", "Pss:"):
            vals[parts[0]] = int(parts[1]) / 1024
    return vals["Rss:"], vals["Pss:"]


def child(args: argparse.Namespace) -> dict:
    sys.path.insert(0, str(ROOT))
    from agentrl.cpu import set_allocator

    set_allocator("reuse")
    import torch

    from agentrl.config import config_from_dict
    from agentrl.learner import Learner
    from agentrl.models import load_model
    from agentrl.run.settings import resolve
    from benchmarks.learner_step import make_groups

    stages: list[dict] = []

    def mark(name: str, tensor_mb: float = 0.0) -> None:
        rss, pss = rss_pss()
        prev = stages[-1]["rss_mb"] if stages else 0.0
        stages.append(
            {
                "stage": name,
                "rss_mb": rss,
                "pss_mb": pss,
                "delta_mb": rss - prev,
                "tensors_mb": tensor_mb,
            }
        )

    def mb(tensors) -> float:
        return sum(t.numel() * t.element_size() for t in tensors) / 2**20

    mark("python + torch + transformers + agentrl imported")
    sampler_model, tok = load_model(args.model, dtype=args.dtype)
    mark(f"sampler model ({args.dtype}) + tokenizer + model code", mb(sampler_model.parameters()))
    policy, _ = load_model(args.model, dtype="float32")
    bf16 = "on" if args.dtype == "bfloat16" else "off"
    cfg = config_from_dict(
        {
            "learner": {"lr": 1e-6, "micro_batch_size": 16, "bf16": bf16},
            "algorithm": {"off_policy": "tis"},
            "orchestrator": {"max_staleness": 0},
        }
    )
    learner = Learner(policy, tok, resolve(cfg).learner)
    mark("learner float32 masters", mb(learner.model.parameters()))
    learner.warmup()
    mark("compiled log-prob kernels (warmup)")
    groups = make_groups(2, 8, 46, 64, policy.config.vocab_size)
    learner.step(groups)
    state = [t for s in learner.optimizer.state.values() for t in s.values() if t.dim() > 0]
    mark("step 1: AdamW state + gradients + activations (peak kept by the allocator)", mb(state))

    target = dict(sampler_model.named_parameters())
    if args.publish == "copy":
        weights = learner.state_dict_for_sampler()
    else:
        weights = learner.sampler_weights()
    with torch.no_grad():
        for k, v in weights.items():
            if k in target:
                target[k].copy_(v)
    published_mb = mb(weights.values()) if args.publish == "copy" else 0.0
    del weights
    mark(f"publish ({args.publish})", published_mb)
    learner.step(groups)
    mark("step 2")
    return {"dtype": args.dtype, "publish": args.publish, "stages": stages}


VARIANTS = ("lazy", "eager", "gc", "mb4")


def shared_prompt_groups(vocab: int, n_groups: int = 2, size: int = 8) -> list:
    """vs_trl's batch shape: every sample of a group shares its 46-token prompt."""
    import random

    from agentrl.types import Segment, Trajectory, TrajectoryGroup

    rng = random.Random(0)
    groups = []
    for g in range(n_groups):
        prompt = [rng.randrange(3, vocab) for _ in range(46)]
        trajs = []
        for i in range(size):
            tokens = [rng.randrange(3, vocab) for _ in range(64)]
            segments = [
                Segment("prompt", prompt),
                Segment("model", tokens, logprobs=[-10.0] * 64, versions=[0] * 64),
            ]
            trajs.append(Trajectory(segments=segments, reward=float(i % 2), traj_id=f"{g}-{i}"))
        groups.append(TrajectoryGroup(task_id=str(g), trajectories=trajs))
    return groups


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def learner_variant(model: str, variant: str) -> dict:
    """Three learner steps of `variant` in this process (see the module doc)."""
    import time

    sys.path.insert(0, str(ROOT))
    from agentrl.cpu import set_allocator

    set_allocator("reuse")
    import torch

    torch.set_num_threads(2)
    from agentrl.config import config_from_dict
    from agentrl.learner import Learner
    from agentrl.models import load_model
    from agentrl.run.settings import resolve

    policy, tok = load_model(model, dtype="float32")
    cfg = config_from_dict(
        {
            "model": {"gradient_checkpointing": variant == "gc"},
            "learner": {"lr": 1e-6, "micro_batch_size": 4 if variant == "mb4" else 16},
            "algorithm": {"off_policy": "tis"},
            "orchestrator": {"max_staleness": 0},
        }
    )
    learner = Learner(policy, tok, resolve(cfg).learner)
    if variant != "lazy":  # AdamW's state now, as its first step() would make it
        for group in learner.optimizer.param_groups:
            for p in group["params"]:
                state = learner.optimizer.state[p]
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    learner.warmup()
    groups = shared_prompt_groups(policy.config.vocab_size)
    out = {"variant": variant, "rss_before_mb": _status_mb("VmRSS"), "steps": []}
    for _ in range(3):
        t0 = time.perf_counter()
        learner.step(groups)
        out["steps"].append(
            {
                "seconds": time.perf_counter() - t0,
                "rss_after_mb": _status_mb("VmRSS"),
                "peak_rss_mb": _status_mb("VmHWM"),
            }
        )
    return out


def learner_variants(args: argparse.Namespace) -> None:
    load = os.getloadavg()[0]
    runs = []
    for variant in args.variants:
        cmd = [sys.executable, __file__, "--child-variant", variant, "--model", args.model]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = runs[-1]
        steps = " | ".join(
            f"{s['seconds']:.1f} s, RSS {s['rss_after_mb']:.0f}, peak {s['peak_rss_mb']:.0f}"
            for s in r["steps"]
        )
        print(f"{variant:<8} before {r['rss_before_mb']:.0f} MB | {steps}", flush=True)
    result = {
        "model": args.model,
        "allocator": "reuse",
        "workload": "2 groups x 8 samples, shared 46-token prompt, 64 model tokens, fp32",
        "runs": runs,
        "cpu_count": os.cpu_count(),
        "loadavg_1m_before_after": [load, os.getloadavg()[0]],
    }
    name = "memory_learner_variants"
    if args.model != "smollm2-135m-instruct":
        name += f"_{args.model}"
    out_path = ROOT / "benchmarks" / "results" / f"{name}.json"
    out_path.write_text(json.dumps(result, indent=2))
    print(f"wrote {out_path}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--publish", nargs="+", default=["copy", "live"])
    ap.add_argument("--learner-variants", action="store_true", help="see the module doc")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--child-variant", help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_variant:
        print(json.dumps(learner_variant(args.model, args.child_variant)))
        return
    if args.learner_variants:
        learner_variants(args)
        return
    if args.child:
        args.publish = args.publish[0]
        print(json.dumps(child(args)))
        return
    load = os.getloadavg()[0]
    runs = []
    for dtype in args.dtypes:
        for publish in args.publish:
            cmd = [sys.executable, __file__, "--child", "--model", args.model, "--dtype", dtype]
            cmd += ["--publish", publish]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    for r in runs:
        print(f"\n{args.model}, sampler {r['dtype']}, publish {r['publish']} (one process)")
        print(f"{'stage':<76}{'RSS MB':>8}{'+MB':>8}{'tensors MB':>12}{'PSS MB':>8}")
        for s in r["stages"]:
            print(
                f"{s['stage']:<76}{s['rss_mb']:>8.0f}{s['delta_mb']:>+8.0f}"
                f"{s['tensors_mb']:>12.0f}{s['pss_mb']:>8.0f}"
            )
    result = {
        "model": args.model,
        "allocator": "reuse",
        "runs": runs,
        "cpu_count": os.cpu_count(),
        "loadavg_1m_before_after": [load, os.getloadavg()[0]],
    }
    name = "memory.json" if args.model == "smollm2-135m-instruct" else f"memory_{args.model}.json"
    out_path = ROOT / "benchmarks" / "results" / name
    out_path.write_text(json.dumps(result, indent=2))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
