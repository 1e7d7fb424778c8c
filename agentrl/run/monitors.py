"""The run's side of the monitors: the response-length drift across steps, and the alerts.

    monitor = RunMonitor(monitor_settings(cfg), events)
    monitor.observe(step, metrics)   # adds monitor/length_drift; publishes AlertFired

The learner reports each batch's ``monitor/*`` numbers (:mod:`agentrl.learner.monitors`);
what needs the history of the run is here: ``monitor/length_drift`` is the step's mean
response length over its mean in the first ``monitors.baseline_steps`` steps, minus 1
(+0.5: half again as long). An alert (``monitors.alerts``) fires on every step its metric
is past its bound: a warning line on stderr and an :class:`AlertFired` event, which
``metrics.jsonl`` keeps.
"""

from __future__ import annotations

import logging
from typing import Any

from agentrl.learner.settings import MonitorSettings
from agentrl.run.events import AlertFired, EventBus

log = logging.getLogger("agentrl.run.monitors")


class RunMonitor:
    """Length drift against the first steps, and the configured alerts."""

    def __init__(self, settings: MonitorSettings, events: EventBus | None = None) -> None:
        self.settings = settings
        self.events = events
        self._lengths: list[float] = []  # the first baseline_steps steps' mean lengths
        self.fired: list[AlertFired] = []

    def observe(self, step: int, metrics: dict[str, Any]) -> list[AlertFired]:
        """Add the run-level monitors to `metrics` (in place) and fire the alerts it
        crosses; returns the alerts fired at this step."""
        length = metrics.get("monitor/response_length")
        if isinstance(length, int | float):
            if len(self._lengths) < self.settings.baseline_steps:
                self._lengths.append(float(length))
            baseline = sum(self._lengths) / len(self._lengths)
            metrics["monitor/length_drift"] = float(length) / max(baseline, 1e-9) - 1.0
        fired = []
        for metric, side, bound in self.settings.alerts:
            value = metrics.get(metric)
            if not isinstance(value, int | float):
                continue
            if (side == "above" and value > bound) or (side == "below" and value < bound):
                alert = AlertFired(
                    step=step, metric=metric, value=float(value), side=side, bound=bound
                )
                log.warning(
                    "alert at step %d: %s = %.4g is %s %.4g (monitors.alerts)",
                    step,
                    metric,
                    value,
                    side,
                    bound,
                )
                if self.events is not None:
                    self.events.publish(alert)
                fired.append(alert)
        self.fired.extend(fired)
        return fired

    def state_dict(self) -> dict[str, Any]:
        """The length baseline, so a resumed run measures drift against the same steps."""
        return {"lengths": list(self._lengths)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._lengths = [float(x) for x in state.get("lengths", [])]
