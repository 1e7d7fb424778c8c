"""GiGPO against GRPO on the grid walk (states recur): same model, seeds and token budget.

Methods, from configs/gigpo_grid_walk.yaml with only the advantage changed:

* ``grpo``  -- episode-level groups only;
* ``gigpo`` -- episode groups plus step groups of the turns taken from the same cell.

Every run trains until it has spent ``--token-budget`` tokens, then its last checkpoint
walks ``--eval-tasks`` held-out tasks (split ``eval``) ``--eval-samples`` times.
Reported per method, mean and spread (population std) over ``--seeds``: held-out success,
training reward per wall-clock minute, mean turns of solved held-out episodes, steps and
minutes the budget bought, and the share of turns that found a step group (a state seen
by another episode of the group). Writes ``<out>.json`` after every run (a run cut off
keeps the finished ones) and ``<out>.png`` at the end, prints a table.

The budget (``--budget``): ``trained`` (default) counts the tokens of the sequences the
learner trains on (prompt, observations and completions: on CPU the learner's forward and
backward over them are most of a step's time, so equal trained tokens is equal compute);
``sampled`` counts only the model tokens sampled, which shrink as a policy learns to answer
in one word, so a terser policy buys many more (and costlier) steps. ``--max-steps`` caps
a run either way.

    python benchmarks/gigpo_vs_grpo.py                              # 3 seeds x 2 methods
    python benchmarks/gigpo_vs_grpo.py --seeds 0 --token-budget 8000
    python benchmarks/gigpo_vs_grpo.py --quick                      # tiny random model
    python benchmarks/gigpo_vs_grpo.py --untrained                  # the starting level

The measurement in docs/credit.md (about 50 minutes on 2 shared CPU cores):

    python benchmarks/gigpo_vs_grpo.py --token-budget 12000 --max-steps 8 --eval-tasks 16 \
        --set rollout.group_size=8 --set learner.batch_groups=1 --set rollout.max_turns=4 \
        --set sampler.max_new_tokens=8 --set learner.lr=5e-5
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentrl.config import Config, load_config
from agentrl.run.events import BatchTrained, GroupFinished
from agentrl.run.orchestrator import Orchestrator
from agentrl.types import TrajectoryGroup

REPO = Path(__file__).resolve().parent.parent
CONFIG = "configs/gigpo_grid_walk.yaml"
METHODS = {"grpo": ["algorithm.advantage=grpo", "algorithm.options={}"], "gigpo": []}
QUICK = ["model.name=tiny-llama", "model.dtype=float32", "sampler.max_new_tokens=4",
         "rollout.max_turns=3", "learner.lr=1e-3"]  # fmt: skip


class Watch:
    """Counts tokens and rewards; stops the run at the step that reaches the budget."""

    def __init__(self, orch: Orchestrator, budget: int, kind: str, max_steps: int) -> None:
        self.orch, self.budget, self.kind, self.max_steps = orch, budget, kind, max_steps
        self.tokens = 0  # sampled model tokens
        self.trained = 0  # tokens of the trained sequences
        self.rewards: list[float] = []
        self.turns = 0
        self.grouped_turns = 0
        self.curve: list[dict[str, float]] = []
        self.t0 = time.time()

    def __call__(self, event: Any) -> None:
        if isinstance(event, GroupFinished):
            self._group(event.group)
        elif isinstance(event, BatchTrained):
            self.trained += int(event.metrics.get("tokens/total", 0))
            self.curve.append(
                {
                    "step": event.step,
                    "tokens": self.tokens,
                    "minutes": (time.time() - self.t0) / 60,
                    "reward_mean": event.metrics.get("reward_mean", math.nan),
                    # the learner's share of the step: sampling is the rest of the minutes
                    "learner_s": event.metrics.get("time/step_s", math.nan),
                    "no_grad_pass_s": event.metrics.get("time/no_grad_pass_s", math.nan),
                    "trained_tokens": self.trained,
                }
            )
            p = self.curve[-1]
            print(f"   step {event.step}: {p['minutes']:.1f} min, sampled {self.tokens}, trained "
                  f"{self.trained}, reward {p['reward_mean']:.3f}, learner {p['learner_s']:.0f} s",
                  flush=True)  # fmt: skip
            spent = self.trained if self.kind == "trained" else self.tokens
            if spent >= self.budget or event.step >= self.max_steps:
                self.orch.cfg.orchestrator.max_steps = event.step

    def _group(self, group: TrajectoryGroup) -> None:
        seen = Counter(s for t in group.valid() for s in set(t.turn_states) if s is not None)
        for t in group.trajectories:
            self.tokens += t.num_model_tokens
            if t.status != "infra_error":
                self.rewards.append(float(t.reward or 0.0))
                self.turns += len(t.turn_states)
                self.grouped_turns += sum(1 for s in t.turn_states if seen.get(s, 0) > 1)


async def held_out(
    cfg: Config, checkpoint: Path | None, n_tasks: int, samples: int
) -> dict[str, float]:
    """Held-out success of `checkpoint` (None: the untrained model)."""
    from agentrl.run.evaluation import SUCCESS
    from agentrl.run.runtime import assemble, load_checkpoint_into_sampler

    run = await anyio.to_thread.run_sync(lambda: assemble(cfg, "eval", samples=samples))
    async with run:
        if checkpoint is not None:
            await load_checkpoint_into_sampler(run, checkpoint)
        tasks = list(itertools.islice(run.env.tasks(split="eval", seed=0), n_tasks))
        groups: list[TrajectoryGroup] = []
        async with anyio.create_task_group() as tg:
            for i, task in enumerate(tasks):

                async def one(task: dict[str, Any] = task, i: int = i) -> None:
                    groups.append(await run.engine.run_task(task, index=i))

                tg.start_soon(one)
    trajs = [t for g in groups for t in g.valid()]
    solved = [t for t in trajs if t.reward > SUCCESS]
    return {
        "success": len(solved) / max(len(trajs), 1),
        "turns_per_solved": statistics.fmean(len(t.turns) for t in solved) if solved else math.nan,
        "samples": float(len(trajs)),
    }


def run_one(method: str, seed: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    overrides = [
        *METHODS[method],
        *(QUICK if args.quick else []),
        f"orchestrator.seed={seed}",
        "orchestrator.max_steps=100000",  # the token budget stops the run
        "orchestrator.time_limit_s=null",
        "orchestrator.eval_every=0",
        "orchestrator.checkpoint_every=0",
        "logging.progress=false",
        *args.set,
    ]
    cfg = load_config(REPO / CONFIG, overrides=overrides)
    run_dir = root / f"{method}-seed{seed}"
    orch = Orchestrator(cfg, run_dir)
    orch.build()
    watch = Watch(orch, args.token_budget, args.budget, args.max_steps)
    orch.events.subscribe(watch)
    t0 = time.time()
    anyio.run(orch.run)
    minutes = (time.time() - t0) / 60
    eval_cfg = load_config(REPO / CONFIG, overrides=overrides)
    scores = anyio.run(held_out, eval_cfg, run_dir, args.eval_tasks, args.eval_samples)
    return {
        "method": method,
        "seed": seed,
        "steps": orch.step,
        "sampled_tokens": watch.tokens,
        "trained_tokens": watch.trained,
        "minutes": minutes,
        "train_reward_mean": statistics.fmean(watch.rewards) if watch.rewards else math.nan,
        "reward_per_minute": sum(watch.rewards) / max(minutes, 1e-9),
        "step_grouped_share": watch.grouped_turns / max(watch.turns, 1),
        **{f"heldout_{k}": v for k, v in scores.items()},
        "curve": watch.curve,
    }


KEYS = ("heldout_success", "heldout_turns_per_solved", "reward_per_minute", "train_reward_mean",
        "step_grouped_share", "sampled_tokens", "trained_tokens", "steps", "minutes")  # fmt: skip


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for method in dict.fromkeys(r["method"] for r in runs):
        rows = [r for r in runs if r["method"] == method]
        out[method] = {}
        for key in KEYS:
            xs = [float(r[key]) for r in rows if not math.isnan(float(r[key]))]
            out[method][key] = {
                "mean": statistics.fmean(xs) if xs else math.nan,
                "std": statistics.pstdev(xs) if len(xs) > 1 else 0.0 if xs else math.nan,
                "n": float(len(xs)),
            }
    return out


def print_table(summary: dict[str, dict[str, dict[str, float]]]) -> None:
    cols = [("held-out success", "heldout_success", "{:.3f}"),
            ("turns/solved", "heldout_turns_per_solved", "{:.2f}"),
            ("reward/min", "reward_per_minute", "{:.2f}"),
            ("train reward", "train_reward_mean", "{:.3f}"),
            ("turns in a step group", "step_grouped_share", "{:.2f}"),
            ("steps", "steps", "{:.1f}"), ("minutes", "minutes", "{:.1f}")]  # fmt: skip
    print("| method | " + " | ".join(c[0] for c in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for method, stats in summary.items():
        cells = []
        for _, key, fmt in cols:
            s = stats[key]
            cells.append(
                "-"
                if math.isnan(s["mean"])
                else f"{fmt.format(s['mean'])} ± {fmt.format(s['std'])}"
            )
        print(f"| {method} | " + " | ".join(cells) + " |")


def plot(runs: list[dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    methods = list(summary)
    for ax, (title, key) in zip(
        axes[:2],
        [
            ("held-out success", "heldout_success"),
            ("training reward per minute", "reward_per_minute"),
        ],
        strict=True,
    ):
        means = [summary[m][key]["mean"] for m in methods]
        stds = [summary[m][key]["std"] for m in methods]
        ax.bar(methods, [0 if math.isnan(v) else v for v in means], yerr=stds, capsize=4)
        ax.set_title(title)
    ax = axes[2]
    for r in runs:
        ax.plot([p["trained_tokens"] for p in r["curve"]], [p["reward_mean"] for p in r["curve"]],
                marker=".", label=f"{r['method']} s{r['seed']}", alpha=0.7)  # fmt: skip
    ax.set_xlabel("trained tokens")
    ax.set_title("training reward")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--token-budget", type=int, default=30_000)
    ap.add_argument(
        "--budget",
        choices=["trained", "sampled"],
        default="trained",
        help="which tokens the budget counts (see above)",
    )
    ap.add_argument("--max-steps", type=int, default=1000, help="learner steps at most per run")
    ap.add_argument("--eval-tasks", type=int, default=32)
    ap.add_argument("--eval-samples", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="tiny random model, a smoke run")
    ap.add_argument("--set", action="append", default=[], help="config override for every run")
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/gigpo_vs_grpo"))
    ap.add_argument(
        "--untrained",
        action="store_true",
        help="only evaluate the untrained model on the same held-out tasks",
    )
    args = ap.parse_args()
    if args.quick:
        args.token_budget = min(args.token_budget, 300)
        args.eval_tasks = min(args.eval_tasks, 2)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.untrained:  # the level both methods start from
        overrides = [*(QUICK if args.quick else []), *args.set]
        cfg = load_config(REPO / CONFIG, overrides=overrides)
        scores = anyio.run(held_out, cfg, None, args.eval_tasks, args.eval_samples)
        result = {"benchmark": "gigpo_vs_grpo/untrained", "eval_tasks": args.eval_tasks,
                  "eval_samples": args.eval_samples, "overrides": args.set,
                  **{f"heldout_{k}": v for k, v in scores.items()}}  # fmt: skip
        out.with_suffix(".json").write_text(json.dumps(result, indent=2))
        print(json.dumps(result))
        return
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gigpo_vs_grpo-") as tmp:
        for seed in args.seeds:  # interleaved, so machine load drifts hit both methods alike
            for method in args.methods:
                print(f"== {method} seed {seed}", flush=True)
                runs.append(run_one(method, seed, args, Path(tmp)))
                write(out, args, runs)  # after every run: a cut-off run still leaves results
                r = runs[-1]
                print(f"   {method} seed {seed}: {r['steps']} steps, {r['sampled_tokens']} "
                      f"tokens, {r['minutes']:.1f} min, held-out {r['heldout_success']:.3f}",
                      flush=True)  # fmt: skip
    print_table(summarise(runs))
    plot(runs, summarise(runs), out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


def write(out: Path, args: argparse.Namespace, runs: list[dict[str, Any]]) -> None:
    result = {
        "benchmark": "gigpo_vs_grpo",
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "token_budget": args.token_budget,
        "budget": args.budget,
        "max_steps": args.max_steps,
        "eval_tasks": args.eval_tasks,
        "eval_samples": args.eval_samples,
        "quick": args.quick,
        "overrides": args.set,
        "complete": len(runs) == len(args.seeds) * len(args.methods),
        "summary": summarise(runs),
        "runs": runs,
    }
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
