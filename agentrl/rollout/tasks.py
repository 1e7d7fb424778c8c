"""The task cursor: a run's position in its environment's task stream.

    cursor = TaskCursor.for_env(env, seed=0)
    index, task = cursor.take()         # in flight from now on (None when the tasks ran out)
    cursor.settle(index)                # its group was buffered, trained or dropped
    state = cursor.state_dict()         # a checkpoint: tasks in flight are re-issued
    cursor.keep = curriculum.keep       # optional: may pass over a task (agentrl.rollout.curriculum)

Tasks are indexed in the order the source generates them, one epoch after another (epoch
e of an environment is ``env.tasks(split, seed + e)``), generated lazily and memoised so a
resumed run sees the same order; `epochs` bounds the stream (None: endless). A task taken
but not settled when a checkpoint is written is taken again first after a resume: none is
skipped, and a group is trained at most once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from agentrl.errors import DatasetError

# a keep() that passes over this many tasks in a row issues the next one anyway
MAX_SKIPS = 10_000


class TaskCursor:
    """Hands out ``(index, task)`` pairs and remembers which are still in flight."""

    def __init__(
        self,
        source: Callable[[int], Iterable[dict[str, Any]]],
        seed: int = 0,
        epochs: int | None = None,
        what: str = "tasks",
    ) -> None:
        self._source = source  # seed -> one epoch of tasks
        self._seed = seed
        self._epochs = epochs
        self._what = what
        self._epoch = -1
        self._cache: list[dict[str, Any]] = []
        self._iter: Iterator[dict[str, Any]] | None = None
        self._exhausted = False
        self.next_index = 0
        self.reissue: list[int] = []
        self.in_flight: set[int] = set()
        # (task, index) -> whether to issue it (a curriculum); None: every task
        self.keep: Callable[[dict[str, Any], int], bool] | None = None

    @classmethod
    def for_env(
        cls, env: Any, seed: int = 0, split: str = "train", epochs: int | None = None
    ) -> TaskCursor:
        return cls(lambda s: env.tasks(split=split, seed=s), seed, epochs, what=f"{split!r} tasks")

    @classmethod
    def over(cls, tasks: Iterable[dict[str, Any]], epochs: int | None = 1) -> TaskCursor:
        """A cursor over a fixed task list (repeated `epochs` times)."""
        fixed = list(tasks)
        return cls(lambda _: fixed, epochs=epochs)

    def task(self, index: int) -> dict[str, Any] | None:
        """The task at `index` of the stream, or None past its end."""
        while index >= len(self._cache) and not self._exhausted:
            if self._iter is None:
                if self._epochs is not None and self._epoch + 1 >= self._epochs:
                    self._exhausted = True
                    break
                self._epoch += 1
                self._iter = iter(self._source(self._seed + self._epoch))
            try:
                self._cache.append(next(self._iter))
            except StopIteration:
                self._iter = None
                if not self._cache:
                    raise DatasetError(
                        f"the environment produced no {self._what}; check env.options "
                        "(the task source) of the config"
                    ) from None
        return self._cache[index] if index < len(self._cache) else None

    def take(self) -> tuple[int, dict[str, Any]] | None:
        """The next task (re-issued ones first), in flight until :meth:`settle`; None when
        a bounded stream has run out."""
        if self.reissue:
            index = self.reissue.pop(0)
        else:
            skips = 0
            while True:
                index = self.next_index
                candidate = self.task(index)
                if candidate is None:
                    return None
                self.next_index += 1
                if self.keep is None or skips >= MAX_SKIPS or self.keep(candidate, index):
                    break
                skips += 1  # passed over: never in flight, never re-issued
        task = self.task(index)
        assert task is not None  # re-issued indices were handed out before
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
