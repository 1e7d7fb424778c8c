"""Faults a learner rank injects into itself, for drills and tests of the failure path:
handed to :class:`~agentrl.run.placement.learner_process.LearnerProcess` (or a Ray rank)
by whoever starts the learner; a whole run reads one from ``AGENTRL_LEARNER_FAULT`` at its
assembly (:func:`drill_fault`). No production constructor reads the environment."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any

from agentrl.errors import ConfigError
from agentrl.learner.learner import PHASES

log = logging.getLogger(__name__)

# a drill's fault for a whole run: RANK:STEP:PHASE:ACTION (see Fault, drill_fault)
FAULT_ENV = "AGENTRL_LEARNER_FAULT"


@dataclass(frozen=True)
class RankPhase:
    """Where a rank was last seen: the phase of a step it started (``Learner.on_phase``)
    and, when an injected :class:`Fault` acted there, what it did (``hold`` / ``kill``)."""

    step: int
    phase: str
    fault: str = ""

    def __str__(self) -> str:
        held = {
            "hold": ", held there by an injected fault",
            "kill": ", killed there by an injected fault",
        }
        return f"{self.phase} of step {self.step}{held.get(self.fault, '')}"


@dataclass(frozen=True)
class Fault:
    """A fault a learner rank injects into itself, for drills and tests of the failure
    path, handed to :class:`LearnerProcess` (or a Ray rank) by whoever starts the learner:
    ``Fault(1, 2, "backward", "kill")``, or ``AGENTRL_LEARNER_FAULT=1:2:backward:kill`` for a
    whole run (:func:`drill_fault`). When rank RANK first starts PHASE (one of :data:`~agentrl.learner.learner.PHASES`) in
    step STEP (1-based, counted over resumes) it reports that to the parent, then
    ``kill``: SIGKILLs itself (a rank dying mid-step, its peers inside the step's
    collectives), or ``hold``: stays there for good (a rank that stops taking part: its
    peers' collectives fail after ``learner.collective_timeout_s``)."""

    rank: int
    step: int
    phase: str
    action: str

    @classmethod
    def from_env(cls) -> Fault | None:
        """The fault ``AGENTRL_LEARNER_FAULT`` names (None when unset)."""
        value = os.environ.get(FAULT_ENV, "").strip()
        if not value:
            return None
        parts = value.split(":")
        fix = (
            f"{FAULT_ENV}={value!r} is not RANK:STEP:PHASE:ACTION (e.g. 1:2:backward:kill; "
            f"PHASE one of {', '.join(PHASES)}; ACTION kill or hold)"
        )
        if len(parts) != 4 or not parts[0].isdigit() or not parts[1].isdigit():
            raise ConfigError(fix)
        fault = cls(int(parts[0]), int(parts[1]), parts[2], parts[3])
        if fault.phase not in PHASES or fault.action not in ("kill", "hold") or fault.step < 1:
            raise ConfigError(fix)
        return fault

    def hits(self, rank: int, step: int, phase: str) -> bool:
        return (rank, step, phase) == (self.rank, self.step, self.phase)

    def act(self) -> None:
        log.warning("injected fault: learner rank %d %ss itself now", self.rank, self.action)
        sys.stdout.flush()
        sys.stderr.flush()
        if self.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Event().wait()  # hold: until the parent kills this rank or goes away


def drill_fault() -> Fault | None:
    """The drill's fault for a run (``AGENTRL_LEARNER_FAULT``), read once where the run
    assembles its learner and handed to it; components never read the environment."""
    return Fault.from_env()


def report_phases(learner: Any, rank: int, send: Any = None, fault: Fault | None = None) -> None:
    """Hand `send` each phase of a step as this rank starts it (``(step, phase, fault)``),
    and act on `fault` where it names this rank (without `send`: only that, as a Ray rank
    does)."""
    if fault is not None and fault.rank != rank:
        fault = None
    if fault is None and send is None:
        return

    def report(phase: str) -> None:
        step = learner.step_count + 1
        hit = fault is not None and fault.hits(rank, step, phase)
        if send is not None:
            send((step, phase, fault.action if hit else ""))
        if hit:
            fault.act()  # type: ignore[union-attr]

    learner.on_phase = report
