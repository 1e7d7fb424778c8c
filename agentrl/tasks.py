"""The task cursor: a run's position in its environment's task stream.

    cursor = TaskCursor(env, seed=0)
    index, task = cursor.take()         # in flight from now on
    cursor.settle(index)                # its group was buffered, trained or dropped
    state = cursor.state_dict()         # a checkpoint: tasks in flight are re-issued

Tasks are indexed in the order the environment generates them, one epoch after another
(epoch e is ``env.tasks(split, seed + e)``), generated lazily and memoised so a resumed run
sees the same order. A task taken but not settled when a checkpoint is written is taken
again first after a resume: none is skipped, and a group is trained at most once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from agentrl.errors import DatasetError


class TaskCursor:
    """Hands out ``(index, task)`` pairs and remembers which are still in flight."""

    def __init__(self, env: Any, seed: int = 0, split: str = "train") -> None:
        self._env = env
        self._seed = seed
        self._split = split
        self._epoch = -1
        self._cache: list[dict[str, Any]] = []
        self._iter: Iterator[dict[str, Any]] | None = None
        self._epoch_len: int | None = None
        self.next_index = 0
        self.reissue: list[int] = []
        self.in_flight: set[int] = set()

    def task(self, index: int) -> dict[str, Any]:
        """The task at `index` of the endless stream."""
        while index >= len(self._cache):
            if self._iter is None:
                self._epoch += 1
                self._iter = iter(self._env.tasks(split=self._split, seed=self._seed + self._epoch))
            try:
                self._cache.append(next(self._iter))
            except StopIteration:
                if self._epoch_len is None:
                    self._epoch_len = len(self._cache)
                    if self._epoch_len == 0:
                        raise DatasetError(
                            f"the environment produced no {self._split!r} tasks; check "
                            "env.options (the task source) of the config"
                        ) from None
                self._iter = None
        return self._cache[index]

    def take(self) -> tuple[int, dict[str, Any]]:
        """The next task (re-issued ones first); it is in flight until :meth:`settle`."""
        if self.reissue:
            index = self.reissue.pop(0)
        else:
            index = self.next_index
            self.next_index += 1
        task = self.task(index)
        self.in_flight.add(index)
        return index, task

    def settle(self, index: int) -> None:
        """The task's group has left the rollout (buffered, trained or dropped)."""
        self.in_flight.discard(index)

    def state_dict(self) -> dict[str, Any]:
        return {
            "next_index": self.next_index,
            "reissue": sorted(set(self.reissue) | self.in_flight),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_index = int(state["next_index"])
        self.reissue = [int(i) for i in state.get("reissue", [])]
        self.in_flight = set()
