"""What the viewer knows of one run folder, read incrementally and never written.

A run folder of `agentrl train` holds ``config.yaml``, ``metrics.jsonl`` (one event a line)
and ``trajectories.jsonl`` (one finished group a line); one of `agentrl rollout --out` /
`agentrl serve` holds only the trajectories. Both files grow while a run trains: each
:meth:`Run.refresh` reads the complete lines appended since the last one (a partial last
line waits for its newline), so a look at the page costs the writer nothing and a long run
is parsed once. A group keeps a small summary in memory and the byte range of its line;
its full trajectories are read back from the file when a page asks for them.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

from agentrl.errors import DatasetError
from agentrl.runfolder import ADVANTAGES, CONFIG, EVAL_TRACE, METRICS, TRACE
from agentrl.view.series import trace_series
from agentrl.view.summary import SORTS, Filters, GroupSummary, summarize


class JsonlTail:
    """Complete lines appended to a JSONL file since the last read (read-only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

        self.size = 0  # the file's size at the last look

    def read_new(self, max_bytes: int | None = None) -> list[tuple[int, bytes]]:
        """``(byte offset, line)`` of each new complete line, about `max_bytes` of them at
        most (a longer line is read whole); [] when the file is absent."""
        try:
            size = self.size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self.offset:  # truncated or replaced: start over
            self.offset = 0
        if size == self.offset:
            return []
        want = size - self.offset if max_bytes is None else min(size - self.offset, max_bytes)
        with self.path.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read(want)
            end = chunk.rfind(b"\n")
            if end < 0 and want < size - self.offset:  # one line longer than max_bytes
                chunk += f.read(size - self.offset - want)
                end = chunk.find(b"\n")  # that line alone
        if end < 0:
            return []
        out, pos = [], self.offset
        for line in chunk[: end + 1].splitlines(keepends=True):
            if line.strip():
                out.append((pos, line))
            pos += len(line)
        self.offset += end + 1
        return out


class Run:
    """One run folder, refreshed on demand (thread-safe: the server answers from threads)."""

    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.name = name
        self.trace = path / TRACE
        self._metrics_tail = JsonlTail(path / METRICS)
        self._trace_tail = JsonlTail(self.trace)
        self._adv_tail = JsonlTail(path / ADVANTAGES)
        self.eval_trace = path / EVAL_TRACE
        self._eval_tail = JsonlTail(self.eval_trace)
        self.eval_groups: list[GroupSummary] = []  # held-out groups, step = the evaluation's
        self.dropped: dict[str, str] = {}  # group id -> why the buffer dropped it
        self.version_at: dict[int, int] = {}  # step -> the learner version that trained it
        self.credit: dict[str, tuple[str, float | None]] = {}  # traj id -> (estimator, adv)
        self.lock = threading.RLock()  # held while reading new lines and while a page renders
        self.events: list[dict[str, Any]] = []
        self._by_step: dict[int, dict[str, float]] = {}  # every event's numbers, per step
        self.trained_steps: list[int] = []  # steps with a BatchTrained event
        self.trained_in: dict[str, int] = {}  # group id -> the step that trained it
        self.finished_steps: list[int] = []  # GroupFinished.step, in trace order
        self.groups: list[GroupSummary] = []
        self.by_group: dict[str, GroupSummary] = {}
        self.by_traj: dict[str, tuple[GroupSummary, int]] = {}
        self.started: dict[str, Any] | None = None
        self.finished: dict[str, Any] | None = None
        self.version = 0  # grows whenever something new was read
        self._last_version = 0
        self._cache: dict[str, Any] = {}

    # --- reading -------------------------------------------------------------------

    def refresh(self, max_bytes: int | None = None) -> bool:
        """Read what was appended since the last call (about `max_bytes` of the trace at
        most); True if anything was."""
        with self.lock:
            new_events = self._metrics_tail.read_new()
            for _, line in new_events:
                row = _loads(line)
                if row is not None:
                    self._add_event(row)
            new_groups = self._trace_tail.read_new(max_bytes)
            for offset, line in new_groups:
                raw = _loads(line)
                if raw is None or "trajectories" not in raw:
                    continue
                n = len(self.groups)
                g = summarize(n, offset, len(line), raw, self._step_of(n, raw))
                g.finished_step = g.step
                if g.group_id in self.trained_in:
                    g.step, g.trained = self.trained_in[g.group_id], True
                g.dropped = self.dropped.get(g.group_id, "")
                self.groups.append(g)
                self.by_group[g.group_id] = g
                for i, t in enumerate(g.trajectories):
                    self.by_traj[t.traj_id] = (g, i)
                    if t.traj_id in self.credit:
                        t.estimator, t.advantage = self.credit[t.traj_id]
            new_credit = self._adv_tail.read_new()
            for _, line in new_credit:
                self._add_credit(_loads(line))
            new_eval = self._eval_tail.read_new()
            for offset, line in new_eval:
                raw = _loads(line)
                if raw is not None and "trajectories" in raw and isinstance(raw.get("step"), int):
                    n = len(self.eval_groups)
                    self.eval_groups.append(summarize(n, offset, len(line), raw, raw["step"]))
            changed = bool(new_events or new_groups or new_credit or new_eval)
            if changed:
                self.version += 1
            return changed

    def _add_credit(self, row: dict[str, Any] | None) -> None:
        """One trained step's recorded advantages onto the samples they belong to."""
        if not row or not isinstance(row.get("advantages"), dict):
            return
        estimator = str(row.get("estimator") or "?")
        for tid, value in row["advantages"].items():
            adv = float(value) if _is_number(value) else None
            self.credit[tid] = (estimator, adv)
            found = self.by_traj.get(tid)
            if found is not None:
                g, i = found
                g.trajectories[i].estimator, g.trajectories[i].advantage = estimator, adv

    def _add_event(self, row: dict[str, Any]) -> None:
        kind = row.get("event")
        self.events.append(row)
        metrics, step = row.get("metrics"), row.get("step")
        if isinstance(metrics, dict) and isinstance(step, int):
            # as the other writers name them: training metrics bare, EvalFinished -> eval/...
            prefix = "" if kind == "BatchTrained" else _prefix(str(kind))
            slot = self._by_step.setdefault(step, {"step": step})
            slot.update({prefix + k: v for k, v in metrics.items() if _is_number(v)})
        if kind == "BatchTrained" and isinstance(step, int):
            # the version it trained from: the previous step's result (0 before the first)
            self.version_at[step] = int(self._last_version)
            if isinstance(row.get("version"), int):
                self._last_version = row["version"]
            self.trained_steps.append(step)
            for gid in row.get("group_ids") or []:
                self.trained_in[gid] = step
                g = self.by_group.get(gid)
                if g is not None:
                    g.step, g.trained = step, True
        elif kind == "GroupDropped" and row.get("group_id"):
            gid = str(row["group_id"])
            self.dropped[gid] = str(row.get("reason") or "dropped")
            g = self.by_group.get(gid)
            if g is not None:
                g.dropped = self.dropped[gid]
        elif kind == "GroupFinished":
            self.finished_steps.append(int(row.get("step", 0)))
        elif kind == "RunStarted":
            self.started, self.finished = row, None
        elif kind == "RunFinished":
            self.finished = row

    def _step_of(self, n: int, raw: dict[str, Any]) -> int:
        """The step a group not (yet) trained belongs to: the one after the learner step it
        was sampled at (its GroupFinished event, in trace order), else its oldest weight
        version (a rollout folder has no metrics)."""
        if n < len(self.finished_steps):
            return self.finished_steps[n] + 1
        versions = [
            v
            for t in raw.get("trajectories", [])
            for s in t.get("segments", [])
            if s.get("kind") == "model"
            for v in s.get("versions", [])
        ]
        return max(min(versions), 0) if versions else 0

    def group(self, group_id: str) -> dict[str, Any]:
        """The full group as written (read back from its line)."""
        g = self.by_group.get(group_id)
        if g is None:
            raise KeyError(group_id)
        return _read_line(self.trace, g, f"the line of group {group_id} no longer parses")

    def eval_group(self, number: int) -> dict[str, Any]:
        """A held-out group as written (read back from eval_trajectories.jsonl)."""
        g = self.eval_groups[number]
        return _read_line(self.eval_trace, g, f"line of held-out group {number} is torn")

    def trajectory(self, traj_id: str) -> tuple[GroupSummary, dict[str, Any], dict[str, Any]]:
        g, i = self.by_traj[traj_id]
        raw = self.group(g.group_id)
        return g, raw, raw["trajectories"][i]

    # --- what the pages ask ----------------------------------------------------------

    @property
    def config_text(self) -> str:
        p = self.path / CONFIG
        return p.read_text(encoding="utf-8") if p.is_file() else ""

    @property
    def unread_mb(self) -> float:
        """Trace not indexed yet (a large run is read in the background as pages answer)."""
        return max(self._trace_tail.size - self._trace_tail.offset, 0) / 2**20

    @property
    def live(self) -> bool:
        return self.started is not None and self.finished is None

    @property
    def num_trajectories(self) -> int:
        return len(self.by_traj)

    def step_numbers(self) -> list[int]:
        return sorted({g.step for g in self.groups})

    def tool_names(self) -> list[str]:
        names = {n for g in self.groups for t in g.trajectories for n in t.tool_names}
        return sorted(names - {""})  # "": a call whose JSON did not parse

    def select(self, f: Filters) -> list[GroupSummary]:
        """Groups with at least one trajectory matching `f` (all groups when none is set)."""
        out = []
        needle = f.q.lower().encode() if f.q else b""
        hits = self._text_hits(needle) if needle else None
        for g in self.groups:
            if f.step is not None and g.step != f.step:
                continue
            if f.task and g.task_id != f.task:
                continue
            if hits is not None and g.number not in hits:
                continue
            if not f.match_group(g):
                continue
            if f.per_trajectory and not any(f.match_traj(t) for t in g.trajectories):
                continue
            out.append(g)
        key = SORTS.get(f.sort.lstrip("-"))
        if key is not None:
            out.sort(key=key, reverse=f.sort.startswith("-"))
        return out

    def _text_hits(self, needle: bytes) -> set[int]:
        """Groups whose line contains `needle` (case-insensitive), scanned from the file."""
        found: set[int] = set()
        with self.trace.open("rb") as f:
            for g in self.groups:
                f.seek(g.offset)
                if needle in f.read(g.size).lower():
                    found.add(g.number)
        return found

    @property
    def steps(self) -> list[dict[str, float]]:
        """Per-step numbers (training, eval, ...) in step order, with the share of the
        step's groups whose rewards are all equal (no signal for group baselines)."""
        equal: dict[int, list[bool]] = {}
        for g in self.groups:
            equal.setdefault(g.step, []).append(g.equal_rewards)
        with self.lock:  # the indexer thread adds steps
            by_step = {k: dict(v) for k, v in self._by_step.items()}
        out = []
        for step in sorted(by_step):
            row = by_step[step]
            if equal.get(step):
                row["equal_reward_groups"] = sum(equal[step]) / len(equal[step])
            out.append(row)
        return out

    def step_table(self) -> list[dict[str, Any]]:
        """One row per step: its groups and what their trajectories add up to."""
        key = ("step_table", self.version)
        if self._cache.get("key") == key:
            return self._cache["rows"]
        rows: dict[int, dict[str, Any]] = {}
        for g in self.groups:
            row = rows.setdefault(
                g.step,
                {
                    "step": g.step,
                    "groups": 0,
                    "trajectories": 0,
                    "reward_sum": 0.0,
                    "equal": 0,
                    "infra": 0,
                    "parse": 0,
                    "tool_calls": 0,
                    "tool_failures": 0,
                    "truncated": 0,
                    "dropped": 0,
                    "valid": 0,
                    "trained": g.trained,
                },
            )
            row["groups"] += 1
            row["trained"] = row["trained"] or g.trained
            row["equal"] += g.equal_rewards
            row["dropped"] += bool(g.dropped)
            for t in g.trajectories:
                row["trajectories"] += 1
                row["tool_failures"] += t.calls_failed
                row["truncated"] += t.shown_status == "truncated"
                if t.status != "infra_error":
                    row["valid"] += 1
                    row["reward_sum"] += t.reward
                row["infra"] += t.status == "infra_error"
                row["parse"] += bool(t.parse_errors)
                row["tool_calls"] += t.tool_calls
        stale = {s["step"]: s.get("staleness/mean") for s in self.steps}
        rollout = {k: v.get("trace/reward_mean") for k, v in trace_series(self).items()}
        out = []
        for step in sorted(rows):
            row = rows[step]
            n = max(row["trajectories"], 1)
            row["reward"] = row["reward_sum"] / max(row["valid"], 1)
            row["tool_calls_per_episode"] = row["tool_calls"] / n
            row["staleness"] = stale.get(step)
            row["rollout_reward"] = rollout.get(step)  # the headline curve's number
            out.append(row)
        self._cache = {"key": key, "rows": out}
        return out

    def metric_series(self) -> dict[str, list[float | None]]:
        """Every numeric per-step metric, aligned on ``step``."""
        steps = self.steps
        keys: list[str] = []
        for s in steps:
            keys.extend(k for k in s if k not in keys)
        return {k: [s.get(k) for s in steps] for k in keys}

    def summary(self) -> dict[str, Any]:
        """The run page's cards: the rollout reward (every finished group, from the trace)
        at the first and last step, the last held-out eval and trained-batch reward."""
        rollout = [
            r["trace/reward_mean"]
            for _, r in sorted(trace_series(self).items())
            if "trace/reward_mean" in r
        ]
        trained = [s for s in self.steps if "reward/mean" in s or "reward_mean" in s]
        evals = [s.get("eval/mean_reward", s.get("eval/reward_mean")) for s in self.steps]
        evals = [e for e in evals if e is not None]
        last = trained[-1] if trained else {}
        return {
            "steps": len(self.trained_steps),
            "groups": len(self.groups),
            "trajectories": self.num_trajectories,
            "first_reward": rollout[0] if rollout else None,
            "last_reward": rollout[-1] if rollout else None,
            "eval_reward": evals[-1] if evals else None,
            "evals": len(evals),
            "batch_reward": last.get("reward/mean"),
            "dropped": sum(1 for g in self.groups if g.dropped),
            "state": "live"
            if self.live
            else (self.finished or {}).get(
                "reason", "finished" if self.trained_steps else "rollout"
            ),
        }


def _read_line(path: Path, g: GroupSummary, torn: str) -> dict[str, Any]:
    """The group whose line `g` indexes in `path`, parsed (`torn`: what a bad line means)."""
    with path.open("rb") as f:
        f.seek(g.offset)
        raw = _loads(f.read(g.size))
    if raw is None:
        raise DatasetError(f"{path}: {torn}")
    return raw


def _loads(line: bytes) -> dict[str, Any] | None:
    try:
        row = json.loads(line)
    except ValueError:
        return None  # a torn or foreign line: skipped, the rest of the run still shows
    return row if isinstance(row, dict) else None


def _prefix(kind: str) -> str:
    name = kind.removesuffix("Finished") or kind
    return name[0].lower() + name[1:] + "/"


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
