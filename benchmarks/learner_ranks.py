"""Peak memory and step time per learner rank at world size 1 vs 2 (FSDP2 / DDP, gloo, CPU).

    nice -n 10 .venv/bin/python benchmarks/learner_ranks.py [--shape smollm2-135m|qwen-0.5b]
        [--worlds 1,2] [--parallel fsdp] [--steps 3]

One run per world size: that many rank processes in one gloo group, each building the
named model shape (randomly initialised: memory and time do not depend on the values),
then ``--steps`` learner steps on a synthetic batch (2 groups x 4 samples of 48 prompt +
96 model tokens, micro_batch_size 4, float32, fused AdamW). Each rank reports its peak RSS
(VmHWM), the RSS before the model was built, the bytes of the parameters, gradients and
AdamW state it holds (its shards under FSDP2), and the seconds of each step. Prints a
table and writes benchmarks/results/learner_ranks_<shape>.json.

Sharding divides the parameter, gradient and optimizer bytes by the world size; what
each rank adds on top (the gathered layer during its forward/backward, activations, the
interpreter and torch) does not shrink. On a CPU the ranks share the machine's cores, so
the step time here says nothing about GPUs (one GPU per rank there).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Llama-family shapes: SmolLM2-135M's own, and a 0.5B one (Qwen2.5-0.5B's widths)
SHAPES = {
    "smollm2-135m": dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        tie_word_embeddings=True,
    ),
    "qwen-0.5b": dict(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
}


def hwm_mb() -> tuple[float, float]:
    """(peak RSS, RSS) of this process in MiB."""
    vals = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            vals[key] = int(rest.split()[0]) / 1024
    return vals["VmHWM"], vals["VmRSS"]


def groups(vocab: int) -> list:
    from agentrl.types import Segment, Trajectory, TrajectoryGroup

    rng = random.Random(0)
    out = []
    for g in range(2):
        prompt = [rng.randrange(3, vocab) for _ in range(48)]
        trajs = []
        for i in range(4):
            model = [rng.randrange(3, vocab) for _ in range(96)]
            trajs.append(
                Trajectory(
                    segments=[
                        Segment("prompt", prompt),
                        Segment("model", model, logprobs=[-2.0] * 96, versions=[0] * 96),
                    ],
                    reward=float(i % 2),
                    task_id=f"t{g}",
                    group_id=f"g{g}",
                    traj_id=f"g{g}-{i}",
                )
            )
        out.append(TrajectoryGroup(task_id=f"t{g}", trajectories=trajs, group_id=f"g{g}"))
    return out


def rank_main(args: argparse.Namespace) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentrl.config import config_from_dict
    from agentrl.learner import Learner
    from agentrl.learner.distributed import init_rank_group, leave_rank_group
    from agentrl.run.settings import resolve

    torch.set_num_threads(args.threads)
    init_rank_group(args.rank, args.world, args.address, device=torch.device("cpu"), timeout_s=1800)
    _, rss_start = hwm_mb()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SHAPES[args.shape]))
    cfg = config_from_dict(
        {
            "learner": {
                "lr": 1e-5,
                "micro_batch_size": 4,
                "bf16": "off",
                "device": "cpu",
                "fused_logprobs": "off",
                "world_size": args.world,
                "parallel": args.parallel,
            },
            "rollout": {"max_tokens": 256},
        }
    )
    learner = Learner(model, None, resolve(cfg).learner)
    batch = groups(SHAPES[args.shape]["vocab_size"])
    steps = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        learner.step(batch)
        steps.append(time.perf_counter() - t0)

    def local_bytes(tensors) -> int:
        total = 0
        for t in tensors:
            t = getattr(t, "_local_tensor", t)  # a DTensor's shard
            total += t.numel() * t.element_size()
        return total

    params = list(learner.model.parameters())
    optim = [v for s in learner.optimizer.state.values() for v in s.values() if v.dim() > 0]
    peak, rss = hwm_mb()
    result = {
        "rank": args.rank,
        "peak_rss_mb": round(peak, 1),
        "rss_mb": round(rss, 1),
        "rss_before_model_mb": round(rss_start, 1),
        "param_mb": round(local_bytes(params) / 2**20, 1),
        "grad_mb": round(local_bytes(params) / 2**20, 1),  # one gradient per parameter
        "adamw_state_mb": round(local_bytes(optim) / 2**20, 1),
        "step_s": [round(s, 2) for s in steps],
        "n_params": sum(p.numel() for p in model.parameters()),
    }
    print("RESULT " + json.dumps(result), flush=True)
    leave_rank_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_world(args: argparse.Namespace, world: int) -> list[dict]:
    address = f"tcp://127.0.0.1:{free_port()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE"}
    common = ["--address", address, "--shape", args.shape, "--parallel", args.parallel]
    common += ["--steps", str(args.steps), "--threads", str(args.threads)]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--rank", str(r), "--world", str(world), *common],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=3600)
        if p.returncode != 0:
            raise SystemExit(f"a rank failed (exit {p.returncode})")
        line = next(x for x in out.splitlines() if x.startswith("RESULT "))
        results.append(json.loads(line[len("RESULT ") :]))
    return sorted(results, key=lambda r: r["rank"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    ap.add_argument("--worlds", default="1,2")
    ap.add_argument("--parallel", choices=["ddp", "fsdp"], default="fsdp")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--address", default="", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.rank >= 0:
        return rank_main(args)
    runs = {}
    print(f"{'world':>5} {'rank':>4} {'peak MB':>8} {'params':>7} {'grads':>6} {'AdamW':>6} step s")
    for world in [int(w) for w in args.worlds.split(",")]:
        results = run_world(args, world)
        runs[str(world)] = results
        for r in results:
            print(
                f"{world:>5} {r['rank']:>4} {r['peak_rss_mb']:>8.0f} {r['param_mb']:>7.0f} "
                f"{r['grad_mb']:>6.0f} {r['adamw_state_mb']:>6.0f} {r['step_s']}"
            )
    out = args.out or ROOT / "benchmarks" / "results" / f"learner_ranks_{args.shape}.json"
    out.write_text(
        json.dumps(
            {
                "shape": args.shape,
                "parallel": args.parallel,
                "steps": args.steps,
                "threads_per_rank": args.threads,
                "workload": "2 groups x 4 samples, 48 prompt + 96 model tokens, "
                "micro_batch_size 4, float32",
                "machine": f"{os.cpu_count()} CPU cores shared with other jobs while measured",
                "runs": runs,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
