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
    learner = Learner(policy, tok, cfg)
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


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--publish", nargs="+", default=["copy", "live"])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    args = ap.parse_args()
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
