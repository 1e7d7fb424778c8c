"""Typed events on an in-process bus, and the subscribers that record a run.

Components publish events; subscribers turn them into files and displays:

* :class:`JsonlMetrics`  -- ``metrics.jsonl`` (always): one line per event with numbers,
* :class:`TraceWriter`   -- ``trajectories.jsonl``: every finished group, read by ``agentrl inspect``,
* :class:`TensorBoardWriter`, :class:`agentrl.run.wandb_writer.WandbWriter` (optional),
* :class:`ProgressDisplay` (rich, optional).

:func:`agentrl.run.subscribers.subscribers_for` builds the ones a ``logging`` config asks for.

Publishing never blocks on a slow subscriber for long and never raises into the
publisher: a subscriber that fails is reported once and detached.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError
from agentrl.runfolder import ADVANTAGES, EVAL_TRACE, JsonlFile

log = logging.getLogger("agentrl.run.events")


@dataclass
class Event:
    time: float = field(default_factory=time.time, kw_only=True)

    @property
    def kind(self) -> str:
        return type(self).__name__

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["event"] = self.kind
        return d


@dataclass
class RunStarted(Event):
    run_dir: str
    config: dict[str, Any]
    resumed_from_step: int = 0


@dataclass
class GroupFinished(Event):
    """A task group finished rollout (the trace writer stores the whole group)."""

    group: Any  # TrajectoryGroup; serialised by TraceWriter, summarised elsewhere
    step: int = 0


@dataclass
class GroupDropped(Event):
    task_id: str
    reason: str  # the buffer counter: dropped_stale, dropped_all_equal, dropped_infra, ...
    task_index: int = -1  # its place in the task stream (an audit accounts for every one)
    group_id: str = ""  # the group as the trace has it (the view shows why it was not trained)


@dataclass
class BatchTrained(Event):
    step: int
    version: int
    metrics: dict[str, float]
    # which groups the step trained (task-stream index, group id): an audit can prove a
    # resumed run trained every sample once
    task_indices: list[int] = field(default_factory=list)
    group_ids: list[str] = field(default_factory=list)


@dataclass
class AdvantagesAssigned(Event):
    """The advantage each sample of a step trained with (the trace writer stores them in
    ``advantages.jsonl``; the metrics log leaves them out)."""

    step: int
    estimator: str  # algorithm.advantage
    advantages: dict[str, float | None]  # trajectory id -> advantage (None: not trained)


@dataclass
class AlertFired(Event):
    """A monitored metric crossed its bound (``monitors.alerts``; :mod:`agentrl.run.monitors`)."""

    step: int
    metric: str
    value: float
    side: str  # above | below
    bound: float


@dataclass
class WeightsPublished(Event):
    version: int
    seconds: float


@dataclass
class CheckpointSaved(Event):
    step: int
    path: str
    seconds: float


@dataclass
class EvalFinished(Event):
    step: int
    metrics: dict[str, float]


@dataclass
class EvalGroupsFinished(Event):
    """The held-out groups of one evaluation (the trace writer stores them in
    ``eval_trajectories.jsonl``, each with its step; the metrics log leaves them out)."""

    step: int
    groups: list[Any]  # TrajectoryGroup


@dataclass
class RunFinished(Event):
    step: int
    reason: str  # completed | interrupted | error
    error: str | None = None


Subscriber = Callable[[Event], None]


class EventBus:
    """Synchronous fan-out to subscribers; a failing subscriber is detached, not fatal."""

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []

    def subscribe(self, fn: Subscriber) -> None:
        self._subscribers.append(fn)

    def publish(self, event: Event) -> None:
        for fn in list(self._subscribers):
            try:
                fn(event)
            except Exception:  # a broken display must not stop training
                log.exception("event subscriber %r failed; detaching it", fn)
                self._subscribers.remove(fn)

    def close(self) -> None:
        for fn in self._subscribers:
            close = getattr(fn, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:
                    log.exception("closing subscriber %r failed", fn)
        self._subscribers.clear()


def step_metrics(event: Event) -> tuple[int, dict[str, float]] | None:
    """``(step, numbers)`` of an event that carries ``step`` and ``metrics``, else None.

    Training metrics keep their names; another event's get its name as a prefix
    (EvalFinished -> ``eval/reward_mean``), so a new event type is logged without edits here.
    """
    metrics = getattr(event, "metrics", None)
    step = getattr(event, "step", None)
    if not isinstance(metrics, dict) or not isinstance(step, int):
        return None
    prefix = "" if isinstance(event, BatchTrained) else _metric_prefix(event.kind)
    numbers = {
        prefix + k: float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
    return step, numbers


def _metric_prefix(kind: str) -> str:
    name = kind.removesuffix("Finished") or kind
    return name[0].lower() + name[1:] + "/"


def summarize_group(group: Any) -> dict[str, float]:
    """Numbers about one finished group, for metrics and progress."""
    trajs = group.trajectories
    n = max(len(trajs), 1)
    valid = [t for t in trajs if t.status != "infra_error"]
    out = {
        "reward_mean": sum(t.reward for t in valid) / max(len(valid), 1),
        "success_rate": sum(1 for t in valid if t.reward > 0.5) / max(len(valid), 1),
        "infra_errors": float(len(trajs) - len(valid)),
        "truncated": sum(1 for t in trajs if t.status == "truncated") / n,
        "tool_calls_per_episode": sum(t.num_tool_calls for t in trajs) / n,
        "parse_errors_per_episode": sum(len(tn.parse_errors) for t in trajs for tn in t.turns) / n,
        "turns_per_episode": sum(len(t.turns) for t in trajs) / n,
        "model_tokens": float(sum(t.num_model_tokens for t in trajs)),
    }
    returns = [
        t.reward_info["return"]
        for t in valid
        if isinstance(t.reward_info.get("return"), int | float)
    ]
    if returns:  # a game's return (TextArena, GEM: outcome and step rewards, each once)
        out["return_mean"] = sum(returns) / len(returns)
    if any("gateway" in t.metadata for t in trajs):
        # agent programs behind the gateway: samples started because the agent changed the
        # model's earlier reply (docs/gateway.md, "What a break costs")
        out["gateway/prefix_breaks"] = float(
            sum(
                1
                for t in trajs
                if str(t.metadata.get("gateway", {}).get("started_by", "")).startswith("prefix")
            )
        )
    return out


class JsonlMetrics:
    """Writes numeric events to ``metrics.jsonl`` (flushed per line: a crash loses nothing)."""

    def __init__(self, path: Path) -> None:
        self._f = JsonlFile(path)

    def __call__(self, event: Event) -> None:
        if isinstance(event, GroupFinished):
            row: dict[str, Any] = {
                "event": "GroupFinished",
                "time": event.time,
                "step": event.step,
                "task_id": event.group.task_id,
                **summarize_group(event.group),
            }
        elif isinstance(event, RunStarted):
            row = {
                "event": "RunStarted",
                "time": event.time,
                "run_dir": event.run_dir,
                "resumed_from_step": event.resumed_from_step,
            }
        elif isinstance(event, AdvantagesAssigned | EvalGroupsFinished):
            return  # per-sample records: the trace's (advantages.jsonl, eval_trajectories.jsonl)
        else:
            row = event.to_dict()
        self._f.write(row)

    def close(self) -> None:
        self._f.close()


class TraceWriter:
    """Appends every finished group to ``trajectories.jsonl`` for ``agentrl inspect``, and
    the advantages each trained step used to ``advantages.jsonl`` beside it (one line a
    step: ``{"step", "estimator", "advantages": {trajectory id: advantage}}``)."""

    def __init__(self, path: Path) -> None:
        self._f = JsonlFile(path)
        self._adv_path = Path(path).with_name(ADVANTAGES)
        self._adv: JsonlFile | None = None  # opened with the first trained step
        self._eval_path = Path(path).with_name(EVAL_TRACE)
        self._eval: JsonlFile | None = None  # opened with the first evaluation

    def __call__(self, event: Event) -> None:
        if isinstance(event, GroupFinished):
            self._f.write_line(event.group.to_json())
        elif isinstance(event, AdvantagesAssigned):
            if self._adv is None:
                self._adv = JsonlFile(self._adv_path)
            row = {"step": event.step, "estimator": event.estimator, "advantages": event.advantages}
            self._adv.write(row)
        elif isinstance(event, EvalGroupsFinished):
            if self._eval is None:
                self._eval = JsonlFile(self._eval_path)
            for group in event.groups:
                self._eval.write({"step": event.step, **group.to_dict()})

    def close(self) -> None:
        self._f.close()
        for f in (self._adv, self._eval):
            if f is not None:
                f.close()


class TensorBoardWriter:
    """Scalars to TensorBoard (needs the `tensorboard` extra)."""

    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # pragma: no cover - depends on extras
            raise ConfigError(
                "logging.tensorboard is on but tensorboard is not installed: "
                "pip install 'agentrl[tensorboard]' or set logging.tensorboard=false"
            ) from e
        self._w = SummaryWriter(str(log_dir))

    def __call__(self, event: Event) -> None:
        found = step_metrics(event)
        if found is not None:
            step, metrics = found
            for k, v in metrics.items():
                self._w.add_scalar(k, v, step)

    def close(self) -> None:
        self._w.close()


class EveryNSteps:
    """Passes a trained step to `inner` every `n` steps, and the last one; all else always.

    A step held back is written when the run finishes (or the subscriber closes) if no
    later one was, so the last step of an interrupted run is never lost.
    """

    def __init__(self, inner: Subscriber, n: int, max_steps: int) -> None:
        if n < 1:
            raise ValueError(f"log_every must be >= 1 (got {n})")
        self._inner = inner
        self._n = n
        self._max_steps = max_steps
        self._held: BatchTrained | None = None

    def __call__(self, event: Event) -> None:
        if isinstance(event, BatchTrained):
            if event.step % self._n != 0 and event.step < self._max_steps:
                self._held = event
                return
            self._held = None
        elif isinstance(event, RunFinished):
            self._release()
        self._inner(event)

    def _release(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            self._inner(held)

    def close(self) -> None:
        self._release()
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()

    def __repr__(self) -> str:
        return f"EveryNSteps({self._inner!r}, n={self._n})"


class ProgressDisplay:
    """A one-line rich status per trained step: step, reward, tokens/s, staleness.

    Not a terminal (a log file, a pipe): exactly one plain line per event, never wrapped.
    """

    def __init__(self, max_steps: int, console: Any = None) -> None:
        from rich.console import Console

        self._console = console or Console(stderr=True)
        # rich wraps at 80 columns when it cannot ask a terminal for its width
        self._soft_wrap = not self._console.is_terminal
        self._max_steps = max_steps
        self._groups = 0
        self._dropped = 0  # groups dropped since the last trained step
        self._t0 = time.time()

    def __call__(self, event: Event) -> None:
        if isinstance(event, GroupFinished):
            self._groups += 1
        elif isinstance(event, GroupDropped):
            self._dropped += 1
            if self._dropped >= 8 and self._dropped & (self._dropped - 1) == 0:  # 8, 16, 32..
                self._print(
                    f"[yellow]waiting for a batch: {self._dropped} groups dropped since the "
                    f"last step (last reason: {event.reason})[/] "
                    f"[dim]{time.time() - self._t0:.0f}s[/]"
                )
        elif isinstance(event, BatchTrained):
            self._dropped = 0
            m = event.metrics
            # no rollout numbers: no group finished during this step (it trained earlier ones)
            reward = f"{m['reward_mean']:.3f}" if "reward_mean" in m else "-"
            success = f"{m['success_rate']:.2f}" if "success_rate" in m else "-"
            self._print(
                f"[bold]step {event.step}/{self._max_steps}[/] "
                f"reward [cyan]{reward}[/] success {success} "
                f"tok/s {m.get('rollout_tokens_per_s', 0.0):.0f} "
                f"staleness {m.get('staleness/mean', 0.0):.2f} "
                f"loss {m.get('loss/total', float('nan')):.4f} "
                f"groups {self._groups} "
                f"[dim]{time.time() - self._t0:.0f}s[/]"
            )
        elif isinstance(event, CheckpointSaved):
            self._print(f"[dim]checkpoint step {event.step} -> {event.path}[/]")
        elif isinstance(event, RunFinished):
            self._print(f"[bold]run {event.reason}[/] at step {event.step}")

    def _print(self, line: str) -> None:
        self._console.print(line, soft_wrap=self._soft_wrap)
