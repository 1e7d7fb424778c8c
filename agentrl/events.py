"""Typed events on an in-process bus, and the subscribers that record a run.

Components publish events; subscribers turn them into files and displays:

* :class:`JsonlMetrics`  -- ``metrics.jsonl`` (always): one line per event with numbers,
* :class:`TraceWriter`   -- ``trajectories.jsonl``: every finished group, read by ``agentrl inspect``,
* :class:`TensorBoardWriter` (optional), :class:`ProgressDisplay` (rich, optional).

Publishing never blocks on a slow subscriber for long and never raises into the
publisher: a subscriber that fails is reported once and detached.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("agentrl.events")


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
    reason: str  # stale | all_equal | infra


@dataclass
class BatchTrained(Event):
    step: int
    version: int
    metrics: dict[str, float]


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


def summarize_group(group: Any) -> dict[str, float]:
    """Numbers about one finished group, for metrics and progress."""
    trajs = group.trajectories
    n = max(len(trajs), 1)
    valid = [t for t in trajs if t.status != "infra_error"]
    return {
        "reward_mean": sum(t.reward for t in valid) / max(len(valid), 1),
        "success_rate": sum(1 for t in valid if t.reward > 0.5) / max(len(valid), 1),
        "infra_errors": float(len(trajs) - len(valid)),
        "truncated": sum(1 for t in trajs if t.status == "truncated") / n,
        "tool_calls_per_episode": sum(t.num_tool_calls for t in trajs) / n,
        "parse_errors_per_episode": sum(len(tn.parse_errors) for t in trajs for tn in t.turns) / n,
        "turns_per_episode": sum(len(t.turns) for t in trajs) / n,
        "model_tokens": float(sum(t.num_model_tokens for t in trajs)),
    }


class JsonlMetrics:
    """Writes numeric events to ``metrics.jsonl`` (flushed per line: a crash loses nothing)."""

    def __init__(self, path: Path) -> None:
        self._f = Path(path).open("a", encoding="utf-8")  # noqa: SIM115 - lives with the run

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
        else:
            row = event.to_dict()
        self._f.write(json.dumps(row, default=str) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class TraceWriter:
    """Appends every finished group to ``trajectories.jsonl`` for ``agentrl inspect``."""

    def __init__(self, path: Path) -> None:
        self._f = Path(path).open("a", encoding="utf-8")  # noqa: SIM115 - lives with the run

    def __call__(self, event: Event) -> None:
        if isinstance(event, GroupFinished):
            self._f.write(event.group.to_json() + "\n")
            self._f.flush()

    def close(self) -> None:
        self._f.close()


class TensorBoardWriter:
    """Scalars to TensorBoard (needs the `tensorboard` extra)."""

    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # pragma: no cover - depends on extras
            from agentrl.errors import ConfigError

            raise ConfigError(
                "logging.tensorboard is on but tensorboard is not installed: "
                "pip install 'agentrl[tensorboard]' or set logging.tensorboard=false"
            ) from e
        self._w = SummaryWriter(str(log_dir))

    def __call__(self, event: Event) -> None:
        if isinstance(event, BatchTrained):
            for k, v in event.metrics.items():
                if isinstance(v, int | float):
                    self._w.add_scalar(k, v, event.step)
        elif isinstance(event, EvalFinished):
            for k, v in event.metrics.items():
                self._w.add_scalar(f"eval/{k}", v, event.step)

    def close(self) -> None:
        self._w.close()


class ProgressDisplay:
    """A one-line rich status per trained step: step, reward, tokens/s, staleness."""

    def __init__(self, max_steps: int, console: Any = None) -> None:
        from rich.console import Console

        self._console = console or Console(stderr=True)
        self._max_steps = max_steps
        self._groups = 0
        self._t0 = time.time()

    def __call__(self, event: Event) -> None:
        if isinstance(event, GroupFinished):
            self._groups += 1
        elif isinstance(event, BatchTrained):
            m = event.metrics
            # no rollout numbers: no group finished during this step (it trained earlier ones)
            reward = f"{m['reward_mean']:.3f}" if "reward_mean" in m else "-"
            success = f"{m['success_rate']:.2f}" if "success_rate" in m else "-"
            self._console.print(
                f"[bold]step {event.step}/{self._max_steps}[/] "
                f"reward [cyan]{reward}[/] success {success} "
                f"tok/s {m.get('rollout_tokens_per_s', 0.0):.0f} "
                f"staleness {m.get('staleness/mean', 0.0):.2f} "
                f"loss {m.get('loss/total', float('nan')):.4f} "
                f"groups {self._groups} "
                f"[dim]{time.time() - self._t0:.0f}s[/]"
            )
        elif isinstance(event, CheckpointSaved):
            self._console.print(f"[dim]checkpoint step {event.step} -> {event.path}[/]")
        elif isinstance(event, RunFinished):
            self._console.print(f"[bold]run {event.reason}[/] at step {event.step}")
