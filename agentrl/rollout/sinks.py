"""Sinks for trajectory groups: where an engine sends what it produced."""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

import anyio

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
