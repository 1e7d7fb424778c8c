"""Time one learner step on SmolLM2-135M: 8 sequences x 256 tokens (64 prompt + 192 model),
side by side with a plain HF step (full logits, ``model(labels=...)`` + backward + AdamW).

    .venv/bin/python benchmarks/learner_step.py [--steps 3] [--bf16 auto|on|off] [--micro 4]
                                                [--threads N] [--no-baseline]

Prints a table and writes benchmarks/results/learner_step.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import torch


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--bf16", default="auto", choices=["auto", "on", "off"])
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--correction", default="none", choices=["none", "tis", "decoupled"])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the plain HF step")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    if args.threads:
        torch.set_num_threads(args.threads)

    from agentrl.config import config_from_dict
    from agentrl.learner import Learner
    from agentrl.models import load_model

    model, tok = load_model(args.model, dtype="float32")
    cfg = config_from_dict(
        {
            "learner": {"lr": 1e-6, "micro_batch_size": args.micro, "bf16": args.bf16},
            "algorithm": {"off_policy": args.correction},
        }
    )
    baseline_s = None
    if not args.no_baseline:
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
    publish_s = time.perf_counter() - t_pub
    result = {
        "model": args.model,
        "sequences": 8,
        "tokens_per_sequence": 256,
        "bf16": learner.bf16,
        "micro_batch_size": args.micro,
        "correction": args.correction,
        "threads": torch.get_num_threads(),
        "step_s": times,
        "step_s_best": min(times),
        "no_grad_pass_s": m["time/no_grad_pass_s"],
        "state_dict_for_sampler_s": publish_s,
        "plain_hf_step_s": baseline_s,
        # this machine is shared: 1-minute load average (cores: os.cpu_count())
        "cpu_count": os.cpu_count(),
        "loadavg_1m_before_after": [load_before, os.getloadavg()[0]],
    }
    print(f"{'config':<40}{'best step (s)':>15}{'all steps (s)':>30}")
    label = f"bf16={learner.bf16} micro={args.micro} corr={args.correction}"
    print(f"{label:<40}{min(times):>15.2f}{', '.join(f'{t:.2f}' for t in times):>30}")
    if baseline_s is not None:
        print(f"{'plain HF fwd+bwd+AdamW (full logits)':<40}{baseline_s:>15.2f}")
    out = Path(__file__).parent / "results" / "learner_step.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
