"""Training curves from a run's ``metrics.jsonl``: a PNG and a summary table."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from agentrl.errors import AgentRLError
from agentrl.extras import require
from agentrl.runfolder import METRICS, read_metrics

# (metric key in BatchTrained.metrics, panel title)
CURVES: list[tuple[str, str]] = [
    ("reward_mean", "reward"),
    ("success_rate", "success rate"),
    ("eval/pass@1", "held-out pass@1 (eval_every)"),
    ("entropy", "entropy"),
    ("kl", "KL to reference"),
    ("pg/clip_frac", "clip fraction"),
    ("staleness/mean", "staleness (versions)"),
    ("rollout_tokens_per_s", "rollout tokens/s"),
    ("tool_calls_per_episode", "tool calls / episode"),
]


def read_steps(run_dir: str | Path) -> list[dict[str, Any]]:
    """The metrics of every trained step, in order (later duplicates of a step win)."""
    if not (Path(run_dir) / METRICS).is_file():
        raise AgentRLError(f"no {METRICS} in {run_dir}: is it a run directory of `agentrl train`?")
    by_step: dict[int, dict[str, Any]] = {}
    for row in read_metrics(run_dir):  # a line cut by SIGKILL is skipped
        if row.get("event") == "BatchTrained":
            by_step[int(row["step"])] = {"step": int(row["step"]), **row.get("metrics", {})}
    return [by_step[k] for k in sorted(by_step)]


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write ``curves.png`` (or `out`) with one panel per metric that the run logged."""
    matplotlib = require("matplotlib", "plots", "drawing curves.png")
    matplotlib.use("Agg")
    plt = require("matplotlib.pyplot", "plots", "drawing curves.png")

    steps = read_steps(run_dir)
    out_path = Path(out) if out else Path(run_dir) / "curves.png"
    present = [(k, t) for k, t in CURVES if any(_finite(s.get(k)) for s in steps)]
    if not present:
        present = CURVES[:1]
    cols = 4
    rows = math.ceil(len(present) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    for ax, (key, title) in zip(axes.flat, present, strict=False):
        ax.set_visible(True)
        xs = [s["step"] for s in steps if _finite(s.get(key))]
        ys = [float(s[key]) for s in steps if _finite(s.get(key))]
        ax.plot(xs, ys, marker="o", ms=3)
        if len(ys) >= 4:  # a moving average shows the trend through GRPO's noise
            w = 3
            ma = [
                sum(ys[max(0, i - w + 1) : i + 1]) / len(ys[max(0, i - w + 1) : i + 1])
                for i in range(len(ys))
            ]
            ax.plot(xs, ma, lw=2, alpha=0.7)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.suptitle(str(Path(run_dir).name))
    fig.tight_layout()
    fig.savefig(out_path, dpi=90)
    plt.close(fig)
    return out_path


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


def learning_summary(steps: list[dict[str, Any]], k: int = 3) -> dict[str, float]:
    """Mean reward of the first and last `k` steps, and the gain between them."""
    rewards = [float(s["reward_mean"]) for s in steps if _finite(s.get("reward_mean"))]
    if not rewards:
        return {}
    first = sum(rewards[:k]) / len(rewards[:k])
    last = sum(rewards[-k:]) / len(rewards[-k:])
    return {
        "first_k_reward": first,
        "last_k_reward": last,
        "gain": last - first,
        "steps": len(rewards),
    }
