"""Weights & Biases subscriber: a run's step metrics as a W&B run (online or offline).

Offline mode needs no network and no account: ``logging.wandb: {mode: offline}`` writes
``<run dir>/wandb/offline-run-*`` that ``wandb sync`` uploads later.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.extras import require
from agentrl.run.events import Event, RunFinished, RunStarted, step_metrics

if TYPE_CHECKING:
    from agentrl.config import WandbConfig


# the W&B run id of a run directory, so a resumed run continues the same W&B run
RUN_ID_FILE = "wandb_run_id"


def import_wandb() -> Any:
    return require("wandb", "wandb", "logging.wandb")


class WandbWriter:
    """Starts a W&B run on RunStarted, logs every event's step metrics, finishes it at the end.

    Training metrics go under their own names, other events' under ``<event>/`` (an
    EvalFinished's ``reward_mean`` is ``eval/reward_mean``), as in TensorBoard.
    """

    def __init__(self, settings: WandbConfig, run_dir: Path) -> None:
        self._wandb = import_wandb()  # fail while the run is built, not at its first step
        self._settings = settings
        self._run_dir = Path(run_dir)
        self._run: Any = None

    @property
    def run(self) -> Any:
        """The W&B run (None before RunStarted and after the run finished)."""
        return self._run

    def __call__(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self._start(event.config, resumed=event.resumed_from_step > 0)
            return
        if isinstance(event, RunFinished):
            self._finish(exit_code=0 if event.reason != "error" else 1)
            return
        found = step_metrics(event)
        if found is None:
            return
        step, metrics = found
        if self._run is None:  # events without a RunStarted (a test, a tool replaying a run)
            self._start({}, resumed=False)
        self._run.log(metrics, step=step)

    def close(self) -> None:
        self._finish(exit_code=0)

    def _start(self, config: dict[str, Any], resumed: bool) -> None:
        if self._run is not None:
            return
        s = self._settings
        wandb = self._wandb
        wandb_dir = Path(s.dir) if s.dir else self._run_dir
        wandb_dir.mkdir(parents=True, exist_ok=True)
        id_file = self._run_dir / RUN_ID_FILE
        run_id = id_file.read_text().strip() if resumed and id_file.is_file() else None
        run_id = run_id or secrets.token_hex(4)
        self._run_dir.mkdir(parents=True, exist_ok=True)
        id_file.write_text(run_id + "\n")
        self._run = wandb.init(
            mode=s.mode,
            project=s.project,
            entity=s.entity,
            name=s.name or self._run_dir.name,
            group=s.group,
            tags=s.tags or None,
            dir=str(wandb_dir),
            config=config,
            id=run_id,
            resume="allow",
            # a run of its own: a second orchestrator in this process does not finish ours
            reinit="create_new",
            # our progress line and logs stay ours: no capture of stdout/stderr
            settings=wandb.Settings(console="off"),
        )

    def _finish(self, exit_code: int) -> None:
        run, self._run = self._run, None
        if run is not None:
            run.finish(exit_code=exit_code)
