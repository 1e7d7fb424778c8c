"""What the lists and filters know of each group and sample: a small summary made once from
its trace line (outcomes, flags, the task's question and target), and the filters and sorts
the groups page applies to them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentrl.view.outcomes import call_error_text, call_outcome, cut_at_limit


@dataclass
class TrajSummary:
    """One trajectory as the lists and filters show it."""

    traj_id: str
    index: int  # position in its group
    reward: float
    status: str
    turns: int
    tool_calls: int
    tool_names: tuple[str, ...]
    parse_errors: int
    model_tokens: int
    length: int
    stop_reason: str
    versions: tuple[int, int] | None  # (oldest, newest) weight version of its tokens
    parent_id: str | None
    # the advantage the learner trained it with, as recorded (advantages.jsonl), and the
    # estimator that made it; None: not recorded (a run written before they were, or a
    # sample not trained yet)
    advantage: float | None = None
    estimator: str | None = None
    cut: bool = False  # its last turn hit the token limit mid-answer (see outcomes.py)
    calls_ok: int = 0
    calls_failed: int = 0  # the tool or its code failed, timed out, or the platform did
    tool_error: str = ""  # the first failed call's error

    @property
    def shown_status(self) -> str:
        """The status the lists show: a cut answer is truncated, whatever the trace says."""
        return "truncated" if self.cut else self.status

    @property
    def advantage_text(self) -> str:
        if self.estimator is None:
            return "not recorded"
        if self.advantage is None:
            return "not trained"  # an infra error, a filtered truncation: no trained token
        return f"{self.advantage:+.3f}"

    @property
    def advantage_label(self) -> str:
        return f"advantage ({self.estimator})" if self.estimator else "advantage"


@dataclass
class GroupSummary:
    """One group: its place in the file and what the lists show."""

    number: int  # order in trajectories.jsonl
    group_id: str
    task_id: str
    step: int
    offset: int
    size: int
    trajectories: list[TrajSummary] = field(default_factory=list)
    is_tree: bool = False
    trained: bool = False  # a BatchTrained event names it (else: sampled, not trained yet)
    dropped: str = ""  # why the buffer did not train it (GroupDropped's reason)
    finished_step: int = 0  # the step during which its rollouts finished
    question: str = ""
    target: str = ""  # the task's reference answer

    @property
    def mixed(self) -> bool:
        valid = [t.reward for t in self.trajectories if t.status != "infra_error"]
        return len(valid) > 1 and max(valid) - min(valid) >= 1e-9

    @property
    def reward_std(self) -> float:
        valid = [t.reward for t in self.trajectories if t.status != "infra_error"]
        if len(valid) < 2:
            return 0.0
        m = sum(valid) / len(valid)
        return (sum((r - m) ** 2 for r in valid) / len(valid)) ** 0.5

    @property
    def calls_failed(self) -> int:
        return sum(t.calls_failed for t in self.trajectories)

    @property
    def truncated(self) -> int:
        return sum(t.shown_status == "truncated" for t in self.trajectories)

    @property
    def outcome(self) -> str:
        """trained | dropped: REASON | pending"""
        if self.trained:
            return "trained"
        return f"dropped: {self.dropped}" if self.dropped else "pending"

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    @property
    def equal_rewards(self) -> bool:
        valid = [t.reward for t in self.trajectories if t.status != "infra_error"]
        return len(valid) > 1 and max(valid) - min(valid) < 1e-9

    @property
    def reward_mean(self) -> float:
        valid = [t.reward for t in self.trajectories if t.status != "infra_error"]
        return sum(valid) / len(valid) if valid else 0.0


def summarize(number: int, offset: int, size: int, raw: dict[str, Any], step: int) -> GroupSummary:
    g = GroupSummary(
        number=number,
        group_id=str(raw.get("group_id") or f"g{number}"),
        task_id=str(raw.get("task_id", "")),
        step=step,
        offset=offset,
        size=size,
    )
    task = raw.get("task") if isinstance(raw.get("task"), dict) else {}
    g.question = str(task.get("question") or task.get("prompt") or "")[:300]
    target = task.get("answer", task.get("answers", task.get("target", "")))
    g.target = str(target if not isinstance(target, list) else " | ".join(map(str, target)))[:120]
    for i, t in enumerate(raw.get("trajectories", [])):
        turns = t.get("turns", [])
        segs = t.get("segments", [])
        versions = [v for s in segs if s.get("kind") == "model" for v in s.get("versions", [])]
        calls = [c for tn in turns for c in tn.get("tool_calls", [])]
        names = tuple(c.get("name", "") for c in calls)
        outcomes = [call_outcome(c) for c in calls]
        failed = [
            c for c, o in zip(calls, outcomes, strict=True) if o in ("error", "timeout", "infra")
        ]
        g.trajectories.append(
            TrajSummary(
                traj_id=str(t.get("traj_id") or f"{g.group_id}-{i}"),
                index=i,
                reward=float(t.get("reward", 0.0)),
                status=str(t.get("status", "ok")),
                turns=len(turns),
                tool_calls=len(names),
                tool_names=names,
                parse_errors=sum(len(tn.get("parse_errors", [])) for tn in turns),
                model_tokens=sum(len(s["token_ids"]) for s in segs if s.get("kind") == "model"),
                length=sum(len(s.get("token_ids", [])) for s in segs),
                stop_reason=_stop_reason(t),
                versions=(min(versions), max(versions)) if versions else None,
                parent_id=t.get("parent_id"),
                cut=cut_at_limit(t),
                calls_ok=outcomes.count("ok"),
                calls_failed=len(failed),
                tool_error=call_error_text(failed[0]) if failed else "",
            )
        )
    g.is_tree = any(t.parent_id for t in g.trajectories)
    return g


def _stop_reason(t: dict[str, Any]) -> str:
    """Why the episode ended: an infra error, a truncation, or the last turn's finish."""
    if t.get("status") == "infra_error":
        return "infra_error"
    trunc = t.get("metadata", {}).get("truncation")
    if trunc:
        return f"truncated: {trunc}"
    if cut_at_limit(t):
        return "cut at the token limit"
    turns = t.get("turns", [])
    if not turns:
        return ""
    last = turns[-1]
    if last.get("tool_calls"):
        return "tool call (no answer)"
    return f"answer ({last.get('finish_reason') or 'stop'})"


@dataclass
class Filters:
    """What the group list shows; every field maps to one URL parameter."""

    step: int | None = None
    status: str = ""  # ok | truncated | infra_error
    reward_min: float | None = None
    reward_max: float | None = None
    parse_error: bool = False
    no_tool_call: bool = False
    tool: str = ""
    q: str = ""
    task: str = ""
    tool_error: bool = False  # a call failed (per trajectory)
    mixed: bool = False  # groups whose rewards differ (per group, as the rest below)
    dropped: bool = False
    truncated: bool = False
    sort: str = ""  # "" (file order) | step | -step | reward | -reward | std | -std | errors

    def match_group(self, g: GroupSummary) -> bool:
        if self.mixed and not g.mixed:
            return False
        if self.dropped and not g.dropped:
            return False
        return not (self.truncated and not g.truncated)

    def match_traj(self, t: TrajSummary) -> bool:
        if self.tool_error and not t.calls_failed:
            return False
        if self.status and t.shown_status != self.status:
            return False
        if self.reward_min is not None and t.reward < self.reward_min:
            return False
        if self.reward_max is not None and t.reward > self.reward_max:
            return False
        if self.parse_error and not t.parse_errors:
            return False
        if self.no_tool_call and t.tool_calls:
            return False
        return not (self.tool and self.tool not in t.tool_names)

    @property
    def per_trajectory(self) -> bool:
        return bool(
            self.status
            or self.reward_min is not None
            or self.reward_max is not None
            or self.parse_error
            or self.no_tool_call
            or self.tool
            or self.tool_error
        )


SORTS: dict[str, Any] = {
    "step": lambda g: (g.step, g.number),
    "reward": lambda g: (g.reward_mean, g.number),
    "std": lambda g: (g.reward_std, g.number),
    "errors": lambda g: (g.calls_failed, g.truncated, g.number),
}
