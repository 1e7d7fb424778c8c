"""Decoupled PPO's proximal log-probs: recomputed (a no-grad pass at the start of each step)
vs AReaL's loglinear interpolation (no pass), side by side: time per step and the gap of
the interpolated log-probs to the recomputed ones.

    .venv/bin/python benchmarks/proximal.py [--model tiny-llama | smollm2-135m-instruct]
        [--steps 3] [--minibatches 1 4] [--lr 1e-4] [--threads N]

Workload: 8 sequences x (64 prompt + 192 model) tokens; half of the groups were sampled by
the weights one version behind the learner (staleness 1), half by its current weights
(staleness 0). Every measured step starts from the same weights and data (a fresh
learner), so the rows differ only in ``algorithm.proximal``; the two methods' steps are
interleaved so that both see the same load on a shared machine. The gap is measured against
``Learner.compute_logprobs`` taken just before the step (outside its timing) over the
trained tokens: |log pi_prox(loglinear) - log pi_prox(recompute)|, and the same for the
importance weight pi_prox / pi_behave; ``behaviour gap`` is |log pi_behave - log pi_prox|,
what ``off_policy: none`` would use instead. Prints a table and writes
benchmarks/results/proximal.json (proximal_<model>.json for other models).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@torch.no_grad()
def _logprobs(model: torch.nn.Module, ids: list[int]) -> list[float]:
    x = torch.tensor([ids])
    logits = model(input_ids=x).logits[0].float()
    lp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, x[0, 1:, None]).squeeze(-1)
    return [0.0, *lp.tolist()]


def make_groups(models: dict[int, torch.nn.Module], vocab: int, prompt: int, response: int):
    """Two groups per version in `models` (version -> the weights that sampled it)."""
    from agentrl.types import Segment, Trajectory, TrajectoryGroup

    rng = random.Random(0)
    groups = []
    for version, model in models.items():
        for g in range(2 // len(models)):
            trajs = []
            for i in range(4):
                ids = [rng.randrange(3, vocab) for _ in range(prompt + response)]
                lps = _logprobs(model, ids)
                trajs.append(
                    Trajectory(
                        segments=[
                            Segment("prompt", ids[:prompt]),
                            Segment(
                                "model",
                                ids[prompt:],
                                logprobs=lps[prompt:],
                                versions=[version] * response,
                            ),
                        ],
                        reward=float(i % 2),
                        traj_id=f"v{version}-{g}-{i}",
                    )
                )
            groups.append(TrajectoryGroup(task_id=f"v{version}-{g}", trajectories=trajs))
    return groups


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--minibatches", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    args = ap.parse_args()

    from agentrl.config import config_from_dict
    from agentrl.learner import Learner
    from agentrl.models import load_model
    from agentrl.run.settings import resolve
    from agentrl.types import Batch

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model(args.model, dtype="float32")
    model.eval()
    vocab = int(model.config.vocab_size)

    def cfg(proximal: str, minibatches: int):
        return config_from_dict(
            {
                "learner": {"lr": args.lr, "micro_batch_size": 4, "minibatches": minibatches},
                "algorithm": {"off_policy": "decoupled", "proximal": proximal},
            }
        )

    # version 0 -> 1: one real step on other data gives the "one version behind" weights
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    stale_model, _ = load_model(args.model, dtype="float32")
    stale_model.load_state_dict(init)
    warm = Learner(model, tok, resolve(cfg("recompute", 1)).learner)
    warm.step(make_groups({0: stale_model}, vocab, 64, 192))
    current = {k: v.detach().clone() for k, v in warm.model.state_dict().items()}
    model.load_state_dict(current)
    stale_model.eval()
    groups = make_groups({0: stale_model, 1: model}, vocab, 64, 192)
    del warm
    batch = Batch.from_groups(groups)
    mask = batch.loss_mask > 0
    behaviour = batch.behavior_logprobs

    load_before = os.getloadavg()[0]
    rows = []
    for minibatches in args.minibatches:
        runs: dict[str, dict[str, list[float]]] = {
            p: {"step": [], "pass": [], "gap": [], "gap_max": [], "w_gap": []}
            for p in ("recompute", "loglinear")
        }
        # interleaved, so that both see the same load on a shared machine; the first is a warm-up
        for i in range(args.steps + 1):
            for proximal, run in runs.items():
                model.load_state_dict(current)
                learner = Learner(model, tok, resolve(cfg(proximal, minibatches)).learner)
                learner.warmup()
                learner.version = 1
                truth = learner.compute_logprobs(batch)
                t0 = time.perf_counter()
                metrics = learner.step(groups)
                elapsed = time.perf_counter() - t0
                used = learner.last_old_logprobs
                assert used is not None
                diff = (used - truth).abs()[mask]
                w_diff = (torch.exp(used - behaviour) - torch.exp(truth - behaviour)).abs()[mask]
                if i == 0:
                    continue
                run["step"].append(elapsed)
                run["pass"].append(metrics["time/no_grad_pass_s"])
                run["gap"].append(float(diff.mean()))
                run["gap_max"].append(float(diff.max()))
                run["w_gap"].append(float(w_diff.mean()))
        for proximal, run in runs.items():
            rows.append(
                {
                    "proximal": proximal,
                    "minibatches": minibatches,
                    "step_s": run["step"],
                    "step_s_median": statistics.median(run["step"]),
                    "no_grad_pass_s_median": statistics.median(run["pass"]),
                    "logprob_gap_mean": statistics.mean(run["gap"]),
                    "logprob_gap_max": max(run["gap_max"]),
                    "is_weight_gap_mean": statistics.mean(run["w_gap"]),
                }
            )
    truth_gap = float((behaviour - truth).abs()[mask].mean())

    print(
        f"{args.model}: 8 x 256 tokens (192 trained), staleness 0 and 1, lr {args.lr}, "
        f"{torch.get_num_threads()} threads; behaviour gap {truth_gap:.2e}"
    )
    print(
        f"{'minibatches':>11}{'proximal':>11}{'step (s)':>10}{'no-grad pass (s)':>18}"
        f"{'|dlogp| mean':>14}{'|dlogp| max':>13}{'|dw| mean':>11}"
    )
    for r in rows:
        print(
            f"{r['minibatches']:>11}{r['proximal']:>11}{r['step_s_median']:>10.3f}"
            f"{r['no_grad_pass_s_median']:>18.3f}{r['logprob_gap_mean']:>14.2e}"
            f"{r['logprob_gap_max']:>13.2e}{r['is_weight_gap_mean']:>11.2e}"
        )
    for mb in args.minibatches:
        re, ll = (
            next(r for r in rows if r["minibatches"] == mb and r["proximal"] == p)
            for p in ("recompute", "loglinear")
        )
        saved = 1 - ll["step_s_median"] / re["step_s_median"]
        print(f"minibatches {mb}: loglinear saves {saved:.0%} of the step")
    result = {
        "model": args.model,
        "sequences": 8,
        "tokens_per_sequence": 256,
        "trained_tokens_per_sequence": 192,
        "staleness": [0, 1],
        "lr": args.lr,
        "threads": torch.get_num_threads(),
        "behaviour_gap_mean": truth_gap,
        "rows": rows,
        # this machine is shared: 1-minute load average (cores: os.cpu_count())
        "cpu_count": os.cpu_count(),
        "loadavg_1m_before_after": [load_before, os.getloadavg()[0]],
    }
    name = "proximal.json" if args.model == "tiny-llama" else f"proximal_{args.model}.json"
    out_path = Path(__file__).parent / "results" / name
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
