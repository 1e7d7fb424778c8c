"""Summary statistics of produced groups (the `agentrl rollout` table, benchmarks)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrl.types import Trajectory, TrajectoryGroup


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]; NaN for no values."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def is_success(t: Trajectory) -> bool:
    """The verifier's verdict when it gives one, else a reward of at least 1."""
    for key in ("success", "correct", "exact_match"):
        if key in t.reward_info:
            return bool(t.reward_info[key])
    return t.reward >= 1.0


def summarize(groups: Sequence[TrajectoryGroup]) -> dict[str, Any]:
    """Means and totals over every trajectory of `groups`."""
    trajs = [t for g in groups for t in g.trajectories]
    n = len(trajs)
    valid = [t for t in trajs if t.status != "infra_error"]
    latencies = [float(t.metadata.get("latency_s", 0.0)) for t in trajs]

    def mean(xs: Sequence[float]) -> float:
        return sum(xs) / len(xs) if xs else float("nan")

    return {
        "groups": len(groups),
        "trajectories": n,
        "branches": sum(1 for t in trajs if t.parent_id is not None),
        "reward_mean": mean([t.reward for t in valid]),
        "success_rate": mean([float(is_success(t)) for t in valid]),
        "turns_mean": mean([len(t.turns) for t in trajs]),
        "tool_calls_mean": mean([t.num_tool_calls for t in trajs]),
        "parse_errors": sum(len(turn.parse_errors) for t in trajs for turn in t.turns),
        "infra_errors": sum(1 for t in trajs if t.status == "infra_error"),
        "truncated": sum(1 for t in trajs if t.status == "truncated"),
        # agent programs behind the gateway: samples started because the agent broke its prefix
        "prefix_breaks": sum(
            1
            for t in trajs
            if str(t.metadata.get("gateway", {}).get("started_by", "")).startswith("prefix")
        ),
        "tokens_mean": mean([t.num_tokens for t in trajs]),
        "model_tokens": sum(t.num_model_tokens for t in trajs),
        "latency_p50_s": percentile(latencies, 50),
        "latency_p95_s": percentile(latencies, 95),
    }
