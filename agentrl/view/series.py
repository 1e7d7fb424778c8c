"""Per-step numbers the view recomputes from the trace, beside the ones metrics.jsonl holds.

The headline reward is the rollout reward over every group that finished during a step
(the ones dynamic sampling dropped too): the mean of the groups' mean rewards, infra
errors left out, as the orchestrator's ``reward_mean`` defines it. ``reward/mean`` is
another number: the reward of the batch the learner trained on, which dynamic sampling
picked. Keys made here start with ``trace/``.
"""

from __future__ import annotations

from typing import Any

from agentrl.view.outcomes import quantiles

Run = Any  # agentrl.view.data.Run (which imports this module for its summary)

# the distributions drawn per step: name -> what it is over
DISTRIBUTIONS = {
    "reward": "reward per sample",
    "length": "tokens per sample (model + observations + prompt)",
}


def trace_series(run: Run) -> dict[int, dict[str, float]]:
    """``step -> {trace/...: value}`` over the groups that finished during each step
    (computed once per version of the run: a page asks several times)."""
    key = (run.version, len(run.groups))
    cached = getattr(run, "_trace_series", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    by_step: dict[int, list[Any]] = {}
    for g in run.groups:
        by_step.setdefault(g.finished_step, []).append(g)
    out: dict[int, dict[str, float]] = {}
    for step, groups in sorted(by_step.items()):
        means = [
            g.reward_mean for g in groups if any(t.status != "infra_error" for t in g.trajectories)
        ]
        trajs = [t for g in groups for t in g.trajectories]
        ok = sum(t.calls_ok for t in trajs)
        failed = sum(t.calls_failed for t in trajs)
        row = {
            "trace/groups": float(len(groups)),
            "trace/truncated": sum(t.shown_status == "truncated" for t in trajs) / len(trajs),
            "trace/tool_failures": float(failed),
        }
        if means:
            row["trace/reward_mean"] = sum(means) / len(means)
        if ok + failed:
            row["trace/tool_success_rate"] = ok / (ok + failed)
        out[step] = row
    run._trace_series = (key, out)
    return out


def distributions(run: Run, steps: list[int]) -> dict[str, list[list[float] | None]]:
    """Per step of `steps`: the quantiles (min, p25, median, p75, max) of each of
    :data:`DISTRIBUTIONS` over the samples that finished during it (infra errors left out)."""
    values: dict[str, dict[int, list[float]]] = {k: {} for k in DISTRIBUTIONS}
    for g in run.groups:
        for t in g.trajectories:
            if t.status == "infra_error":
                continue
            values["reward"].setdefault(g.finished_step, []).append(t.reward)
            values["length"].setdefault(g.finished_step, []).append(float(t.length))
    return {k: [quantiles(v.get(s, [])) for s in steps] for k, v in values.items()}


def metric_payload(run: Run) -> dict[str, Any]:
    """What /api/metrics answers for one run: every numeric series aligned on ``step``
    (metrics.jsonl's and the trace's), the per-step distributions, the metric names."""
    with run.lock:
        recorded = {s["step"]: s for s in run.steps}
        traced = trace_series(run)
        steps = sorted(set(recorded) | set(traced))
        rows = [{**traced.get(s, {}), **recorded.get(s, {}), "step": s} for s in steps]
        keys: list[str] = []
        for r in rows:
            keys.extend(k for k in r if k not in keys)
        series = {k: [r.get(k) for r in rows] for k in keys}
        dists = distributions(run, steps)
    return {
        "series": series,
        "dists": dists,
        "keys": sorted(k for k in keys if k != "step"),
        "live": run.live,
        "version": run.version,
    }


def eval_table(run: Run) -> tuple[list[int], list[dict[str, Any]]]:
    """The evaluation steps, and per held-out task its groups by step: ``{"task_id",
    "question", "target", "by_step": {step: GroupSummary}}`` in task order."""
    steps = sorted({g.step for g in run.eval_groups})
    tasks: dict[str, dict[str, Any]] = {}
    for g in run.eval_groups:
        row = tasks.setdefault(
            g.task_id,
            {"task_id": g.task_id, "question": g.question, "target": g.target, "by_step": {}},
        )
        row["by_step"][g.step] = g
    return steps, list(tasks.values())


def config_diff(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(dotted key, value in a, value in b)`` for every leaf that differs."""
    fa, fb = _flatten(a), _flatten(b)
    missing = object()
    out = []
    for k in sorted(set(fa) | set(fb)):
        va, vb = fa.get(k, missing), fb.get(k, missing)
        if va != vb:
            out.append(
                (k, "(absent)" if va is missing else va, "(absent)" if vb is missing else vb)
            )
    return out


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key))
        else:
            out[key] = v
    return out
