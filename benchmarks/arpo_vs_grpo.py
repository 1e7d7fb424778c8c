"""ARPO's claim measured against GRPO: same task, model and seeds, equal sampled tokens.

Methods (each from its shipped config, with only the seed and the stopping rule changed):

* ``grpo``      -- configs/search_demo.yaml: 8 independent samples per question;
* ``arpo``      -- configs/arpo_search_qa.yaml: 8-path trees, branches after high-entropy
                   tool results, ``hard`` attribution of shared tokens;
* ``arpo_tree`` -- the same trees with Tree-GRPO's advantage (``tree_grpo``: intra-tree
                   + inter-tree normalisation).

Every run trains until it has *sampled* ``--token-budget`` model tokens (a branch's
shared prefix is sampled once: only tokens after its branch position count; dropped
groups count too), then its last checkpoint answers ``--eval-tasks`` held-out questions
(cities and countries no training question names) ``--eval-samples`` times each.
Reported per method, mean and spread (population std) over ``--seeds``:

* held-out success (fraction of held-out samples answered exactly);
* tool calls per solved held-out question (searches in the samples that solved it);
* reward per wall-clock minute (training reward collected / minutes of the run);
* training steps and minutes the budget bought;
* branching: tool results where the rule was evaluated, how often a branch fired, the
  entropy after a tool result (normalised by ln|V|) and its change from the episode's
  first turn (dH), for fired and non-fired points; top-up samples when no branch fired.

Writes ``<out>.json`` and ``<out>.png`` and prints a table.

    python benchmarks/arpo_vs_grpo.py                      # 3 seeds x 3 methods, ~3 h on 2 cores
    python benchmarks/arpo_vs_grpo.py --seeds 0 --token-budget 20000
    python benchmarks/arpo_vs_grpo.py --quick              # tiny random model, a smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentrl.config import Config, load_config
from agentrl.run.events import BatchTrained, GroupFinished
from agentrl.run.orchestrator import Orchestrator
from agentrl.types import Trajectory, TrajectoryGroup

REPO = Path(__file__).resolve().parent.parent
METHODS: dict[str, tuple[str, list[str]]] = {
    "grpo": ("configs/search_demo.yaml", []),
    "arpo": ("configs/arpo_search_qa.yaml", []),
    "arpo_tree": ("configs/arpo_search_qa.yaml", ["algorithm.advantage=tree_grpo"]),
}
# a smoke run: the tiny random model, whose first turn is scripted to search
QUICK = [
    "model.name=tiny-llama",
    "model.dtype=float32",
    "env.name=tests.envs.scripted_search:ScriptedSearchQAEnv",
    "env.options.fewshot=none",
    "env.options.top_k=1",
    "sampler.max_new_tokens=4",
    "rollout.max_turns=2",
    "rollout.max_tokens=256",
    "algorithm.dynamic_sampling=false",
    "learner.lr=1e-3",
]


def sampled_tokens(traj: Trajectory) -> int:
    """Model tokens this path sampled itself (a branch shares its parent's prefix)."""
    start, pos, n = traj.branch_position or 0, 0, 0
    for seg in traj.segments:
        if seg.kind == "model":
            n += max(0, pos + len(seg) - max(pos, start))
        pos += len(seg)
    return n


class BudgetWatch:
    """Counts what the run sampled and stops it at the step that reaches the budget."""

    def __init__(self, orch: Orchestrator, budget: int) -> None:
        self.orch, self.budget = orch, budget
        self.tokens = 0
        self.rewards: list[float] = []
        self.points: list[dict[str, Any]] = []
        self.top_up = 0
        self.curve: list[dict[str, float]] = []
        self.t0 = time.time()

    def __call__(self, event: Any) -> None:
        if isinstance(event, GroupFinished):
            self._group(event.group)
        elif isinstance(event, BatchTrained):
            self.curve.append(
                {
                    "step": event.step,
                    "tokens": self.tokens,
                    "minutes": (time.time() - self.t0) / 60,
                    "reward_mean": event.metrics.get("reward_mean", math.nan),
                }
            )
            if self.tokens >= self.budget:
                # the learner loop ends after this step and checkpoints it as the last
                self.orch.cfg.orchestrator.max_steps = event.step

    def _group(self, group: TrajectoryGroup) -> None:
        self.top_up += int(group.metadata.get("arpo", {}).get("top_up", 0))
        for t in group.trajectories:
            self.tokens += sampled_tokens(t)
            if t.status != "infra_error":
                self.rewards.append(float(t.reward or 0.0))
            self.points += t.metadata.get("branch_points", [])


async def held_out(cfg: Config, checkpoint: Path, n_tasks: int, samples: int) -> dict[str, float]:
    """Success and tool calls per solved question of `checkpoint` on held-out questions."""
    import itertools

    from agentrl.run.evaluation import SUCCESS
    from agentrl.run.runtime import assemble, load_checkpoint_into_sampler

    run = await anyio.to_thread.run_sync(lambda: assemble(cfg, "eval", samples=samples))
    async with run:
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
    calls = [sum(len(turn.tool_calls) for turn in t.turns) for t in solved]
    return {
        "success": len(solved) / max(len(trajs), 1),
        "tool_calls_per_solved": sum(calls) / len(calls) if calls else math.nan,
        "tool_calls_per_sample": sum(len(u.tool_calls) for t in trajs for u in t.turns)
        / max(len(trajs), 1),
        "samples": float(len(trajs)),
    }


def branch_stats(points: list[dict[str, Any]], top_up: int) -> dict[str, float]:
    fired = [p for p in points if p.get("branch")]
    quiet = [p for p in points if not p.get("branch")]

    def mean(xs: list[float]) -> float:
        return statistics.fmean(xs) if xs else math.nan

    return {
        "branch_points": float(len(points)),
        "fired_fraction": len(fired) / len(points) if points else math.nan,
        "h_post_mean": mean([p["h_post"] for p in points]),
        "delta_h_mean": mean([p["delta_h"] for p in points]),
        "delta_h_std": statistics.pstdev([p["delta_h"] for p in points]) if points else math.nan,
        "delta_h_fired": mean([p["delta_h"] for p in fired]),
        "delta_h_not_fired": mean([p["delta_h"] for p in quiet]),
        "top_up_samples": float(top_up),
    }


def run_one(method: str, seed: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    path, extra = METHODS[method]
    overrides = [
        *extra,
        *(QUICK if args.quick else []),
        f"orchestrator.seed={seed}",
        "orchestrator.max_steps=100000",  # the token budget stops the run
        "orchestrator.time_limit_s=null",
        "orchestrator.eval_every=0",
        "orchestrator.checkpoint_every=0",
        "logging.progress=false",
        *args.set,
    ]
    cfg = load_config(REPO / path, overrides=overrides)
    run_dir = root / f"{method}-seed{seed}"
    orch = Orchestrator(cfg, run_dir)
    orch.build()
    watch = BudgetWatch(orch, args.token_budget)
    orch.events.subscribe(watch)
    t0 = time.time()
    anyio.run(orch.run)
    minutes = (time.time() - t0) / 60
    eval_cfg = load_config(REPO / path, overrides=overrides)
    scores = anyio.run(held_out, eval_cfg, run_dir, args.eval_tasks, args.eval_samples)
    return {
        "method": method,
        "seed": seed,
        "steps": orch.step,
        "sampled_tokens": watch.tokens,
        "minutes": minutes,
        "train_reward_mean": statistics.fmean(watch.rewards) if watch.rewards else math.nan,
        "reward_per_minute": sum(watch.rewards) / max(minutes, 1e-9),
        **{f"heldout_{k}": v for k, v in scores.items()},
        **branch_stats(watch.points, watch.top_up),
        "curve": watch.curve,
    }


SUMMARY_KEYS = (
    "heldout_success",
    "heldout_tool_calls_per_solved",
    "reward_per_minute",
    "train_reward_mean",
    "sampled_tokens",
    "steps",
    "minutes",
    "fired_fraction",
    "delta_h_mean",
    "delta_h_fired",
    "delta_h_not_fired",
    "h_post_mean",
    "branch_points",
    "top_up_samples",
)


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """method -> key -> {mean, std, n} over seeds (NaNs left out)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for method in dict.fromkeys(r["method"] for r in runs):
        rows = [r for r in runs if r["method"] == method]
        out[method] = {}
        for key in SUMMARY_KEYS:
            xs = [float(r[key]) for r in rows if not math.isnan(float(r[key]))]
            out[method][key] = {
                "mean": statistics.fmean(xs) if xs else math.nan,
                "std": statistics.pstdev(xs) if len(xs) > 1 else 0.0 if xs else math.nan,
                "n": float(len(xs)),
            }
    return out


def print_table(summary: dict[str, dict[str, dict[str, float]]]) -> None:
    cols = [
        ("held-out success", "heldout_success", "{:.3f}"),
        ("calls/solved", "heldout_tool_calls_per_solved", "{:.2f}"),
        ("reward/min", "reward_per_minute", "{:.2f}"),
        ("steps", "steps", "{:.1f}"),
        ("branch fired", "fired_fraction", "{:.2f}"),
        ("dH fired", "delta_h_fired", "{:+.3f}"),
        ("dH not fired", "delta_h_not_fired", "{:+.3f}"),
    ]
    print("| method | " + " | ".join(c[0] for c in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for method, stats in summary.items():
        cells = []
        for _, key, fmt in cols:
            s = stats[key]
            cells.append(
                "-"
                if math.isnan(s["mean"])
                else f"{fmt.format(s['mean'])} ± {fmt.replace('+', '').format(s['std'])}"
            )
        print(f"| {method} | " + " | ".join(cells) + " |")


def plot(runs: list[dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    methods = list(summary)
    for ax, (title, key) in zip(
        axes[:3],
        [
            ("held-out success", "heldout_success"),
            ("tool calls per solved question", "heldout_tool_calls_per_solved"),
            ("training reward per minute", "reward_per_minute"),
        ],
        strict=True,
    ):
        means = [summary[m][key]["mean"] for m in methods]
        stds = [summary[m][key]["std"] for m in methods]
        ax.bar(methods, [0 if math.isnan(v) else v for v in means], yerr=stds, capsize=4)
        ax.set_title(title)
    ax = axes[3]
    for method in methods:
        for r in (r for r in runs if r["method"] == method):
            xs = [p["tokens"] for p in r["curve"]]
            ys = [p["reward_mean"] for p in r["curve"]]
            ax.plot(xs, ys, marker=".", label=f"{method} s{r['seed']}", alpha=0.7)
    ax.set_xlabel("sampled tokens")
    ax.set_title("training reward")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def earlier_runs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The runs of ``--add-to``, refused when they were measured under other settings."""
    earlier = json.loads(args.add_to.read_text())
    for key, ours in (
        ("token_budget", args.token_budget),
        ("eval_tasks", args.eval_tasks),
        ("eval_samples", args.eval_samples),
        ("quick", args.quick),
        ("overrides", args.set),
    ):
        if earlier.get(key) != ours:
            raise SystemExit(
                f"--add-to {args.add_to}: its {key} is {earlier.get(key)!r}, this run's is "
                f"{ours!r}; runs are only comparable under the same settings"
            )
    return list(earlier["runs"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--token-budget", type=int, default=60_000)
    ap.add_argument("--eval-tasks", type=int, default=32)
    ap.add_argument("--eval-samples", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="tiny random model, scripted search")
    ap.add_argument("--set", action="append", default=[], help="config override for every run")
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/arpo_vs_grpo"))
    ap.add_argument(
        "--add-to",
        type=Path,
        help="an earlier result JSON: its runs join this one's (same budget, eval and "
        "overrides required; a method and seed it already holds is not run again)",
    )
    args = ap.parse_args()
    if args.quick:
        args.token_budget = min(args.token_budget, 200)
        args.eval_tasks = min(args.eval_tasks, 2)
    runs = earlier_runs(args) if args.add_to else []
    done = {(r["method"], r["seed"]) for r in runs}
    with tempfile.TemporaryDirectory(prefix="arpo_vs_grpo-") as tmp:
        for seed in args.seeds:  # interleaved, so machine load drifts hit every method alike
            for method in args.methods:
                if (method, seed) in done:
                    continue
                print(f"== {method} seed {seed}", flush=True)
                runs.append(run_one(method, seed, args, Path(tmp)))
    summary = summarise(runs)
    print_table(summary)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "arpo_vs_grpo",
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "token_budget": args.token_budget,
        "eval_tasks": args.eval_tasks,
        "eval_samples": args.eval_samples,
        "quick": args.quick,
        "overrides": args.set,
        "summary": summary,
        "runs": runs,
    }
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    plot(runs, summary, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
