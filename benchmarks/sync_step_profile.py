"""Where a synchronous learner step's time goes, against torch's own limits for its shape
(issue 51 item 4).

The step of ``benchmarks/vs_trl.py``'s ``sync`` configuration (SmolLM2-135M-Instruct,
float32 masters, 2 groups x 8 samples of a shared 48-token prompt + 64 model tokens, one
micro-batch of 16, GRPO / PPO clip, ``off_policy: tis`` with the proximal bypass, fused
log-probs), each variant in its own process:

- ``eager``: the benchmark's learner (float32 compute, ``learner.bf16: off``);
- ``compiled``: the same with ``learner.compile: on`` (torch.compile of each decoder layer;
  the first step pays for compiling and is not counted);
- ``bf16``: bf16 autocast (``learner.bf16: on``; float32 where the CPU has no bf16);
- a ``-mbN`` suffix (``eager-mb8``): micro-batches of N (same gradients, fewer activations
  held at once).

Each process times ``--steps`` steps by phase (the learner's own ``on_phase`` marks:
forward = decoder + LM-head log-probs + loss, backward, optimizer = clip + AdamW), the
LM-head log-prob forward on its own, then profiles one step with ``torch.profiler`` and sums
the time of the matmul ops (``aten::mm`` / ``addmm`` / ``bmm`` / ``linear`` / SDPA) against
everything else. Torch's limit for the shape: the step's model FLOPs
(:mod:`benchmarks.flops`) over the best GEMM rate this process reaches on the step's own
largest decoder matmul (tokens x 576 x 1536 forward) and on a 1024^3 square, measured right
after the steps (same threads, same load).

    .venv/bin/python benchmarks/sync_step_profile.py [--variants eager compiled bf16] [--steps 4]

Prints a table and writes benchmarks/results/sync_step_profile.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
GROUPS, GROUP, PROMPT, NEW = 2, 8, 48, 64
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_scaled_dot_product", "mkldnn")


def make_groups(vocab: int) -> list[Any]:
    """2 groups of 8: each group's prompt shared by its samples, as in GRPO."""
    from agentrl.types import Segment, Trajectory, TrajectoryGroup

    rng = random.Random(0)
    groups = []
    for g in range(GROUPS):
        prompt = [rng.randrange(3, vocab) for _ in range(PROMPT)]
        trajs = []
        for i in range(GROUP):
            r = [rng.randrange(3, vocab) for _ in range(NEW)]
            logprobs = [-rng.uniform(0.1, 3.0) for _ in range(NEW)]
            trajs.append(
                Trajectory(
                    segments=[
                        Segment("prompt", prompt),
                        Segment("model", r, logprobs=logprobs, versions=[0] * NEW),
                    ],
                    reward=float(i % 2),
                    traj_id=f"{g}-{i}",
                )
            )
        groups.append(TrajectoryGroup(task_id=str(g), trajectories=trajs))
    return groups


def gemm_rate(m: int, k: int, n: int, dtype: torch.dtype, seconds: float = 1.0) -> float:
    """Best GFLOP/s of an ``[m, k] @ [k, n]`` matmul on this process's threads."""
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    for _ in range(3):
        torch.mm(a, b)
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = max(best, 2 * m * k * n / (time.perf_counter() - t0) / 1e9)
    return best


def child(variant: str, steps: int, model_name: str) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    import agentrl.learner.forward as fwd
    from agentrl.config import config_from_dict
    from agentrl.learner import Learner
    from agentrl.models import load_model
    from agentrl.run.settings import resolve
    from benchmarks.flops import step_flops

    variant, _, mb = variant.partition("-mb")  # eager-mb8: micro-batches of 8
    micro = int(mb) if mb else GROUPS * GROUP
    model, tok = load_model(model_name, dtype="float32")
    cfg = config_from_dict(
        {
            "model": {"name": model_name, "dtype": "float32"},
            "learner": {
                "lr": 1e-6,
                "micro_batch_size": micro,
                "bf16": "on" if variant == "bf16" else "off",
                "compile": "on" if variant == "compiled" else "off",
                "grad_clip": 1.0,
            },
            "algorithm": {
                "advantage": "grpo",
                "policy_loss": "ppo",
                "agg": "token-mean",
                "eps_low": 0.2,
                "eps_high": 0.28,
                "off_policy": "tis",
            },
            "orchestrator": {"max_staleness": 0},
        }
    )
    learner = Learner(model, tok, resolve(cfg).learner)
    groups = make_groups(model.config.vocab_size)

    marks: list[tuple[str, float]] = []
    learner.on_phase = lambda name: marks.append((name, time.perf_counter()))
    head_s: list[float] = []
    inner = fwd.chunked_logprobs_entropy

    def timed_head(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        out = inner(*a, **kw)
        head_s.append(time.perf_counter() - t0)
        return out

    fwd.chunked_logprobs_entropy = timed_head  # the LM-head log-prob forward, on its own
    import threading

    page = os.sysconf("SC_PAGE_SIZE")

    def rss_mb() -> float:
        return int(Path("/proc/self/statm").read_text().split()[1]) * page / 2**20

    rss_top = [0.0]
    halt = threading.Event()

    def watch() -> None:  # the process's RSS every 10 ms: the step's own peak
        while not halt.is_set():
            rss_top[0] = max(rss_top[0], rss_mb())
            halt.wait(0.01)

    threading.Thread(target=watch, daemon=True).start()
    rss_loaded = rss_mb()
    rows = []
    for i in range(steps + 1):  # the first step warms up (compiles) and is not counted
        marks.clear()
        head_s.clear()
        rss_before, rss_top[0] = rss_mb(), 0.0
        t0 = time.perf_counter()
        m = learner.step(groups)
        end = time.perf_counter()
        phases: dict[str, float] = defaultdict(float)
        stamps = [*marks, ("end", end)]
        phases["before the first phase"] = stamps[0][1] - t0
        for (name, a), (_, b) in itertools.pairwise(stamps):
            phases[name] += b - a
        if i:
            rows.append(
                {
                    "step_s": end - t0,
                    "phases_s": dict(phases),
                    "lm_head_logprob_forward_s": sum(head_s),
                    "no_grad_pass_s": m.get("time/no_grad_pass_s", 0.0),
                    "proximal_bypass": m.get("learner/proximal_bypass"),
                    "rss_before_mb": rss_before,
                    "rss_peak_in_step_mb": rss_top[0],
                    "rss_after_mb": rss_mb(),
                }
            )
    fwd.chunked_logprobs_entropy = inner
    halt.set()
    opt_state = sum(
        t.numel() * t.element_size()
        for st in learner.core.optimizer.state.values()
        for t in st.values()
        if torch.is_tensor(t)
    )
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        learner.step(groups)
        profiled_s = time.perf_counter() - t0
    gemm_s, top = 0.0, []
    for ev in prof.key_averages():
        self_s = ev.self_cpu_time_total / 1e6
        if any(ev.key.startswith(op) for op in GEMM_OPS):
            gemm_s += self_s
        top.append((self_s, ev.key, ev.count))
    top.sort(reverse=True)
    # the model FLOPs of the step: the prompt forwarded once per group (share_prompt)
    lengths = [PROMPT + NEW] * GROUPS + [NEW] * (GROUPS * (GROUP - 1))
    trained = [NEW] * (GROUPS * GROUP)
    flops = step_flops(model.config, lengths, trained)
    dtype = torch.bfloat16 if learner.bf16 else torch.float32
    tokens = sum(lengths)
    h, inter = model.config.hidden_size, model.config.intermediate_size
    shape_rate = gemm_rate(tokens, h, inter, dtype)
    square_rate = gemm_rate(1024, 1024, 1024, dtype)
    best = min(r["step_s"] for r in rows)
    import resource

    return {
        "variant": variant,
        "micro_batch_size": micro,
        "threads": torch.get_num_threads(),
        "compute_dtype": str(dtype).removeprefix("torch."),
        "steps": rows,
        "best_step_s": best,
        "median_step_s": sorted(r["step_s"] for r in rows)[len(rows) // 2],
        "profiled_step_s": profiled_s,
        "profiled_gemm_s": gemm_s,
        "profile_top_self_cpu": [
            {"op": k, "self_s": round(s, 4), "calls": c} for s, k, c in top[:15]
        ],
        "model_gflop": flops / 1e9,
        "tokens_forwarded": tokens,
        "gemm_gflops_step_shape": shape_rate,
        "gemm_gflops_1024": square_rate,
        "floor_s_at_step_shape_rate": flops / 1e9 / shape_rate,
        "achieved_gflops": flops / 1e9 / best,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_after_load_mb": rss_loaded,
        "parameters_mb": param_bytes / 2**20,
        "adamw_state_mb": opt_state / 2**20,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--variants", nargs="+", default=["eager", "compiled", "bf16"])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="tiny-llama: a smoke run")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/sync_step_profile.json"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.model)))
        return
    load = [os.getloadavg()[0]]
    rows = []
    for v in args.variants:
        cmd = [sys.executable, __file__, "--child", v, "--steps", str(args.steps)]
        cmd += ["--model", args.model]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT, env=env)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        load.append(os.getloadavg()[0])
        r = rows[-1]
        ph = r["steps"][0]["phases_s"]
        print(
            f"{v:9s} best {r['best_step_s']:.2f} s median {r['median_step_s']:.2f} s | "
            + " ".join(f"{k} {x:.2f}" for k, x in ph.items())
            + f" | LM-head lp fwd {r['steps'][0]['lm_head_logprob_forward_s']:.2f}"
            f" | GEMM {r['profiled_gemm_s']:.2f} of {r['profiled_step_s']:.2f} s profiled"
            f" | {r['model_gflop']:.0f} GFLOP, {r['achieved_gflops']:.1f} GFLOP/s vs "
            f"{r['gemm_gflops_step_shape']:.1f} at the step's GEMM shape "
            f"(floor {r['floor_s_at_step_shape_rate']:.2f} s), {r['gemm_gflops_1024']:.1f} at "
            f"1024^3 | RSS loaded {r['rss_after_load_mb']:.0f}, before/peak/after a step "
            f"{r['steps'][-1]['rss_before_mb']:.0f}/{r['steps'][-1]['rss_peak_in_step_mb']:.0f}/"
            f"{r['steps'][-1]['rss_after_mb']:.0f} MB (params {r['parameters_mb']:.0f}, "
            f"AdamW {r['adamw_state_mb']:.0f})",
            flush=True,
        )
    sys.path.insert(0, str(ROOT))
    from benchmarks.vs_trl import machine

    result = {
        "benchmark": "sync_step_profile",
        "workload": f"SmolLM2-135M, {GROUPS} groups x {GROUP} samples, shared {PROMPT}-token "
        f"prompt + {NEW} model tokens, one micro-batch of {GROUPS * GROUP}, float32 masters",
        "machine": machine(),
        "loadavg_1m": load,
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
