"""The runs under a folder, and the thread that keeps reading what they gain."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from agentrl.errors import DatasetError
from agentrl.view.data import METRICS, TRACE, Run


class Catalog:
    """The runs under a folder: the folder itself when it is a run, else each subfolder
    (any depth up to 3) holding a ``metrics.jsonl`` or a ``trajectories.jsonl``."""

    def __init__(self, root: Path, pending_run: bool = False) -> None:
        """`pending_run`: `root` is a run about to start (``train --view``): no file yet."""
        root = Path(root)
        self.pending_run = pending_run
        if root.is_file() and root.name == TRACE:
            root = root.parent
        if not root.is_dir():
            raise DatasetError(
                f"no run folder at {root}: pass a run directory of `agentrl train` or "
                "`agentrl rollout --out`, or a folder of them"
            )
        self.root = root.resolve()
        self.runs: dict[str, Run] = {}
        self.discover()
        if not self.runs:
            raise DatasetError(
                f"{root} holds no run: expected {METRICS} or {TRACE} in it or in its subfolders"
            )

    def discover(self) -> None:
        """Pick up runs started since the last look (a folder of runs grows too)."""
        if self.pending_run or _is_run(self.root):
            if not self.runs:
                self.runs = {self.root.name: Run(self.root, self.root.name)}
            return
        for dirpath, dirnames, _ in os.walk(self.root):
            depth = len(Path(dirpath).relative_to(self.root).parts)
            dirnames[:] = sorted(
                d for d in dirnames if not d.startswith(".") and d != "checkpoints"
            )
            if depth >= 3:
                dirnames[:] = []
            p = Path(dirpath)
            if p != self.root and _is_run(p):
                name = p.relative_to(self.root).as_posix()
                if name not in self.runs:  # a new dict: pages iterate the old one meanwhile
                    self.runs = {**self.runs, name: Run(p, name)}
                dirnames[:] = []

    def refresh(self, max_bytes: int | None = None) -> bool:
        self.discover()
        changed = False
        for run in list(self.runs.values()):
            changed |= run.refresh(max_bytes)
        return changed

    def get(self, name: str) -> Run:
        run = self.runs.get(name)
        if run is None:
            raise KeyError(name)
        return run


class Indexer:
    """Reads what the runs gain, a chunk at a time, on a thread: a large run's pages answer
    while it is still being read, and a growing run's pages see new steps within
    `interval` seconds."""

    def __init__(self, catalog: Catalog, chunk_bytes: int = 4 << 20, interval: float = 0.25):
        self.catalog = catalog
        self.chunk_bytes = chunk_bytes
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="agentrl-view-index", daemon=True)

    def start(self) -> Indexer:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self.catalog.refresh(self.chunk_bytes):
                self._stop.wait(self.interval)  # caught up: look again shortly

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)


def _is_run(p: Path) -> bool:
    return (p / METRICS).is_file() or (p / TRACE).is_file()
