"""`agentrl train` that stops at a named moment and waits there to be killed.

    python -m tests.faults.held_driver MOMENT MARKER -- ARGS OF agentrl...

At MOMENT the driver writes the file MARKER (what it is doing, e.g. the step) and blocks
that thread for good: a test that waits for the file then SIGKILLs the driver knows where
the kill landed, instead of hoping a random offset hit it. The rest of the driver (the
event loop, the learner child, the sandboxes) keeps running, as in a real run.

Moments:
  checkpoint_write  the first checkpoint write of this run, after the learner's part is in
                    the temporary folder, before the loop state, the rename and ``latest``.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

MOMENTS = ("checkpoint_write",)


def _hold(marker: Path, said: str) -> None:
    marker.write_text(said)
    threading.Event().wait()  # held here until the process is killed


def hold_in_checkpoint_write(marker: Path) -> None:
    import agentrl.run.orchestrator as orchestrator

    real = orchestrator.save_run_checkpoint

    def save_run_checkpoint(run_dir: Any, step: int, state: Any, save_learner: Any, **kw: Any):
        def learner_part_then_hold(path: Path) -> None:
            save_learner(path)
            _hold(marker, f"inside the write of step {step}")

        return real(run_dir, step, state, learner_part_then_hold, **kw)

    orchestrator.save_run_checkpoint = save_run_checkpoint  # type: ignore[assignment]


def main(argv: list[str]) -> None:
    moment, marker, sep, *args = argv
    if sep != "--" or moment not in MOMENTS:
        raise SystemExit(f"usage: held_driver {{{','.join(MOMENTS)}}} MARKER -- ARGS")
    {"checkpoint_write": hold_in_checkpoint_write}[moment](Path(marker))
    from agentrl.cli import main as agentrl_main

    sys.argv = ["agentrl", *args]
    agentrl_main()


if __name__ == "__main__":
    main(sys.argv[1:])
