"""The subscribers a ``logging`` config asks for (the writers are in :mod:`agentrl.run.events`
and :mod:`agentrl.run.wandb_writer`)."""

from __future__ import annotations

from pathlib import Path

from agentrl.config import LoggingConfig
from agentrl.run.events import (
    EveryNSteps,
    JsonlMetrics,
    ProgressDisplay,
    Subscriber,
    TensorBoardWriter,
    TraceWriter,
)
from agentrl.run.wandb_writer import WandbWriter
from agentrl.runfolder import METRICS, TRACE


def subscribers_for(logging_cfg: LoggingConfig, run_dir: Path, max_steps: int) -> list[Subscriber]:
    """Every subscriber a ``logging`` config asks for, writing into `run_dir`.

    ``metrics.jsonl`` always; the trace, TensorBoard, W&B and the progress line when on.
    Metric writers see a trained step every ``log_every`` steps (and the last); the trace
    and the progress line see every event.
    """
    run_dir = Path(run_dir)
    every = logging_cfg.log_every

    def thinned(writer: Subscriber) -> Subscriber:
        return writer if every == 1 else EveryNSteps(writer, every, max_steps)

    subscribers: list[Subscriber] = []
    try:
        subscribers.append(thinned(JsonlMetrics(run_dir / METRICS)))
        if logging_cfg.trace:
            subscribers.append(TraceWriter(run_dir / TRACE))
        if logging_cfg.tensorboard:
            subscribers.append(thinned(TensorBoardWriter(run_dir / "tensorboard")))
        if logging_cfg.wandb.enabled:
            subscribers.append(thinned(WandbWriter(logging_cfg.wandb, run_dir)))
        if logging_cfg.progress:
            subscribers.append(ProgressDisplay(max_steps))
    except BaseException:  # e.g. an extra not installed: no file stays open
        for fn in subscribers:
            close = getattr(fn, "close", None)
            if close is not None:
                close()
        raise
    return subscribers
