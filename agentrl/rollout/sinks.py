"""Sinks for trajectory groups: where an engine sends what it produced, and reading it back."""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

import anyio

from agentrl.errors import DatasetError
from agentrl.runfolder import TRACE
from agentrl.types import TrajectoryGroup


class JsonlSink:
    """Appends one :class:`TrajectoryGroup` per line to a JSONL file (flushed per group).

    Use as an async context manager, or call :meth:`aclose` when done.
    """

    def __init__(self, path: str | Path, mode: str = "w") -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = self.path.open(mode, encoding="utf-8")
        self._lock = anyio.Lock()
        self.count = 0

    async def __call__(self, group: TrajectoryGroup) -> None:
        line = group.to_json() + "\n"
        async with self._lock:
            if self._file is None:
                raise RuntimeError(f"JsonlSink({self.path}) is closed")
            f = self._file
            await anyio.to_thread.run_sync(lambda: (f.write(line), f.flush()))
            self.count += 1

    async def aclose(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    async def __aenter__(self) -> JsonlSink:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


def read_groups(path: str | Path) -> list[TrajectoryGroup]:
    """The groups in a ``trajectories.jsonl`` (or the run folder holding one), in order."""
    path = Path(path)
    file = path / TRACE if path.is_dir() else path
    if not file.is_file():
        raise DatasetError(
            f"no trajectories at {file}: pass a trajectories.jsonl file or a run folder "
            "written by `agentrl rollout` / `agentrl train`"
        )
    groups = []
    for n, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            groups.append(TrajectoryGroup.from_json(line))
        except (ValueError, KeyError, TypeError) as e:
            raise DatasetError(f"{file}:{n}: not a trajectory group ({e})") from None
    return groups
