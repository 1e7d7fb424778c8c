"""The buffer between rollout actors and the learner.

Actors ``put`` finished :class:`~agentrl.types.TrajectoryGroup` s; the learner takes
``get_batch(n_groups, learner_version)``. On the way the buffer applies, in order:

* infra-failure masking -- ``infra_error`` trajectories stay in their group (for traces)
  but the learner masks them out of the loss and the baseline; a group left with fewer
  than ``min_valid`` valid samples cannot form a baseline and is dropped, and after
  ``max_dropped`` such groups in a row the run stops naming the last error (an agent
  command or a sandbox that always fails would otherwise draw tasks forever);
* DAPO dynamic sampling (when on) -- a group whose valid rewards are all equal has zero
  advantage everywhere and is dropped; actors keep sampling until the batch is full, but
  not forever: after ``max_dropped`` such groups in a row (a warning half way) the buffer
  raises :class:`~agentrl.errors.TrainingStalledError`, or with ``on_max_dropped="train"``
  admits them until a group with differing rewards comes; with ``min_reward_std`` a group
  whose reward std is below it is dropped (``dropped_low_std``) under the same bound;
* the staleness gate -- ``learner_version - oldest token version <= max_staleness``,
  checked on admission and again on release, since the learner moves on while a group
  waits.

``put`` returns an :class:`Admission`: admitted, or the counter it was dropped under, so
the caller needs no separate ``check``. Everything dropped is counted in
:attr:`Buffer.counters`; groups evicted after admission also go to the ``on_evict``
callback (the orchestrator gives their permits back and starts their replacements).
Capacity is bounded: ``put`` waits while the buffer is full (backpressure on the actors).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

from agentrl.algos import dynamic_sampling_mask
from agentrl.errors import TrainingStalledError
from agentrl.types import TrajectoryGroup

log = logging.getLogger(__name__)

COUNTER_NAMES = (
    "received",  # groups offered to put()
    "admitted",  # groups that passed every check on admission
    "released",  # groups handed to the learner
    "dropped_stale",  # staleness gate on admission
    "dropped_stale_in_buffer",  # went stale while waiting in the buffer
    "dropped_all_equal",  # dynamic sampling
    "admitted_all_equal",  # dynamic sampling gave up waiting (on_max_dropped: train)
    "dropped_low_std",  # dynamic sampling: reward std below min_reward_std (not all equal)
    "admitted_low_std",  # the same, admitted after giving up waiting
    "dropped_infra",  # fewer than min_valid valid samples
    "masked_infra_trajectories",  # infra_error samples masked inside admitted groups
    "trajectories_admitted",
)


# a dynamic-sampling drop -> the counter of the same group admitted after giving up waiting
_FORCED = {"dropped_all_equal": "admitted_all_equal", "dropped_low_std": "admitted_low_std"}


class BufferClosedError(RuntimeError):
    """``get_batch`` cannot be satisfied: the buffer was closed and is short of groups."""


@dataclass(frozen=True)
class Admission:
    """What ``put`` did with a group: truthy when admitted."""

    reason: str | None = None  # the counter it was dropped under; None when admitted

    @property
    def admitted(self) -> bool:
        return self.reason is None

    def __bool__(self) -> bool:
        return self.admitted


ADMITTED = Admission()


def _all_rewards_equal(group: TrajectoryGroup, min_std: float = 0.0) -> bool:
    """DAPO's dynamic-sampling test on one group's valid samples, by the algos function
    the learner's tests pin down (:func:`agentrl.algos.dynamic_sampling_mask`): True when
    they are all equal or (``min_std > 0``) their std is below ``min_std``."""
    import torch

    rewards = torch.tensor(group.rewards, dtype=torch.float64)
    valid = torch.tensor([t.status != "infra_error" for t in group.trajectories])
    ids = torch.zeros_like(rewards, dtype=torch.long)
    keep = dynamic_sampling_mask(rewards, ids, valid, min_std=min_std)
    return not bool(keep.any())


class Buffer:
    """Bounded, staleness-gated FIFO of trajectory groups (async, anyio)."""

    def __init__(
        self,
        max_staleness: int | None = 1,
        capacity: int = 64,
        dynamic_sampling: bool = False,
        min_valid: int = 2,
        learner_version: int = 0,
        on_evict: Callable[[list[TrajectoryGroup]], None] | None = None,
        max_dropped: int = 64,
        on_max_dropped: str = "error",
        min_reward_std: float = 0.0,
    ) -> None:
        if max_staleness is not None and max_staleness < 0:
            raise ValueError(
                f"max_staleness must be >= 0 or None to disable the gate (got {max_staleness})"
            )
        if capacity < 1:
            raise ValueError(f"buffer capacity must be >= 1 (got {capacity})")
        if min_valid < 1:
            raise ValueError(f"min_valid must be >= 1 (got {min_valid})")
        if max_dropped < 1:
            raise ValueError(f"max_dropped must be >= 1 (got {max_dropped})")
        if on_max_dropped not in ("error", "train"):
            raise ValueError(f"on_max_dropped must be 'error' or 'train' (got {on_max_dropped!r})")
        if min_reward_std < 0:
            raise ValueError(f"min_reward_std must be >= 0 (got {min_reward_std})")
        self.max_staleness = max_staleness
        self.capacity = capacity
        self.dynamic_sampling = dynamic_sampling
        self.min_valid = min_valid
        self.learner_version = learner_version
        self.on_evict = on_evict
        self.max_dropped = max_dropped
        self.on_max_dropped = on_max_dropped
        self.min_reward_std = min_reward_std
        self.dropped_in_a_row = 0  # all-equal groups since the last admitted one
        self.infra_in_a_row = 0  # groups short of valid samples since the last admitted one
        self.counters: dict[str, int] = dict.fromkeys(COUNTER_NAMES, 0)
        self._groups: deque[TrajectoryGroup] = deque()
        self._cond = anyio.Condition()
        self._closed = False

    @property
    def waiting_tasks(self) -> int:
        """Tasks blocked here now: producers waiting for room, a learner waiting for a batch."""
        return self._cond.statistics().tasks_waiting

    # --- checks --------------------------------------------------------------------

    @staticmethod
    def _oldest_valid_version(group: TrajectoryGroup) -> int | None:
        # a replayed success (rollout.group_hooks: replay) is off-policy by design: the
        # off-policy correction weights it, the gate looks at the fresh samples
        vs = [
            v
            for t in group.valid()
            if "replayed_from" not in t.metadata and (v := t.oldest_version) is not None
        ]
        return min(vs) if vs else None

    def staleness(self, group: TrajectoryGroup, learner_version: int | None = None) -> int:
        """``learner_version - oldest token version`` over the group's valid samples."""
        oldest = self._oldest_valid_version(group)
        lv = self.learner_version if learner_version is None else learner_version
        return 0 if oldest is None else lv - oldest

    def _is_stale(self, group: TrajectoryGroup) -> bool:
        return self.max_staleness is not None and self.staleness(group) > self.max_staleness

    def check(self, group: TrajectoryGroup) -> str | None:
        """The counter a group would be dropped under, or None if it is admissible."""
        valid = group.valid()
        if len(valid) < self.min_valid:
            return "dropped_infra"
        if self.dynamic_sampling and _all_rewards_equal(group, self.min_reward_std):
            return "dropped_all_equal" if _all_rewards_equal(group) else "dropped_low_std"
        if self._is_stale(group):
            return "dropped_stale"
        return None

    # --- producer / consumer -----------------------------------------------------------

    async def put(self, group: TrajectoryGroup) -> Admission:
        """Admit `group` (waiting while the buffer is full); says why when it is dropped."""
        self.counters["received"] += 1
        reason = self.check(group)
        forced = reason is not None and reason in _FORCED and not self._keep_waiting(group, reason)
        if forced:
            self.counters[_FORCED[str(reason)]] += 1
            reason = "dropped_stale" if self._is_stale(group) else None
        if reason == "dropped_infra":
            self._count_infra(group)
        if reason is not None:
            self.counters[reason] += 1
            return Admission(reason)
        async with self._cond:
            while len(self._groups) >= self.capacity and not self._closed:
                await self._cond.wait()
            if self._closed:
                raise BufferClosedError("put() on a closed buffer")
            # the learner may have advanced while we waited for room
            if self._is_stale(group):
                self.counters["dropped_stale"] += 1
                return Admission("dropped_stale")
            self._groups.append(group)
            if not forced:  # a group with a learning signal: dynamic sampling is working
                self.dropped_in_a_row = 0
            self.infra_in_a_row = 0
            self.counters["admitted"] += 1
            self.counters["trajectories_admitted"] += len(group.trajectories)
            self.counters["masked_infra_trajectories"] += len(group.trajectories) - len(
                group.valid()
            )
            self._cond.notify_all()
        return ADMITTED

    def _count_infra(self, group: TrajectoryGroup) -> None:
        """A run whose every episode fails for an infrastructure reason (a sandbox that cannot
        start, an agent command that exits at once) would draw tasks forever: after
        ``max_dropped`` such groups in a row it stops, naming the last error."""
        self.infra_in_a_row += 1
        if self.infra_in_a_row < self.max_dropped:
            return
        errors = [t.error for t in group.trajectories if t.error]
        last = errors[-1] if errors else "no message"
        raise TrainingStalledError(
            f"{self.infra_in_a_row} groups in a row had fewer than {self.min_valid} valid "
            f"samples: every episode failed for an infrastructure reason (last: {last}); "
            "stopping. To fix: run one group with `agentrl rollout CONFIG --tasks 1` and read its "
            "error (the sandbox, the tool server or the agent command), or raise "
            "rollout.infra_retries for flaky infrastructure (the bound is "
            "algorithm.max_dropped_groups)"
        )

    def _keep_waiting(self, group: TrajectoryGroup, reason: str = "dropped_all_equal") -> bool:
        """Dynamic sampling's bound (verl's ``max_num_gen_batches``): True while dropping
        all-equal groups may still lead somewhere; warns half way, then raises
        :class:`TrainingStalledError` or (``on_max_dropped="train"``) admits the group."""
        self.dropped_in_a_row += 1
        n, limit = self.dropped_in_a_row, self.max_dropped
        if reason == "dropped_low_std":
            cause = (
                f"{n} groups in a row had all rewards equal or a reward std below "
                f"algorithm.min_group_reward_std={self.min_reward_std:g} (last: "
                f"{[round(r, 4) for r in group.rewards]}), so dynamic sampling dropped them"
            )
        else:
            cause = (
                f"{n} groups in a row had all rewards equal (last: {group.rewards[0]:g} for "
                "every sample), so dynamic sampling dropped them: the model never (or always) "
                "succeeds at these tasks"
            )
        fix = (
            "make the tasks easier (or harder), raise rollout.group_size, raise "
            "algorithm.max_dropped_groups, set algorithm.on_max_dropped=train to train on "
            "them anyway, or turn algorithm.dynamic_sampling off"
        )
        if reason == "dropped_low_std":
            fix += " (or lower algorithm.min_group_reward_std)"
        if n == max(limit // 2, 1) and n < limit:
            log.warning("%s; still sampling (gives up after %d). To fix: %s", cause, limit, fix)
        if n < limit:
            return True
        if self.on_max_dropped == "error":
            raise TrainingStalledError(f"{cause}; stopping. To fix: {fix}")
        return False

    def _evict_stale(self) -> None:
        if self.max_staleness is None:
            return
        kept = deque(g for g in self._groups if not self._is_stale(g))
        evicted = [g for g in self._groups if self._is_stale(g)]
        self.counters["dropped_stale_in_buffer"] += len(evicted)
        self._groups = kept
        if evicted and self.on_evict is not None:
            self.on_evict(evicted)

    async def set_learner_version(self, learner_version: int) -> None:
        """Tell the buffer the learner moved on; evicts groups that became stale."""
        async with self._cond:
            self.learner_version = learner_version
            self._evict_stale()
            self._cond.notify_all()

    async def get_batch(self, n_groups: int, learner_version: int) -> list[TrajectoryGroup]:
        """Wait until `n_groups` fresh groups are buffered and take them (oldest first)."""
        if n_groups < 1:
            raise ValueError(f"n_groups must be >= 1 (got {n_groups})")
        if n_groups > self.capacity:
            raise ValueError(
                f"n_groups ({n_groups}) exceeds the buffer capacity ({self.capacity}): "
                "raise the capacity or lower learner.batch_groups"
            )
        async with self._cond:
            self.learner_version = learner_version
            while True:
                self._evict_stale()
                if len(self._groups) >= n_groups:
                    break
                if self._closed:
                    raise BufferClosedError(
                        f"buffer closed with {len(self._groups)} groups, {n_groups} requested"
                    )
                self._cond.notify_all()  # eviction may have made room for waiting producers
                await self._cond.wait()
            batch = [self._groups.popleft() for _ in range(n_groups)]
            self.counters["released"] += n_groups
            self._cond.notify_all()
        return batch

    async def close(self) -> None:
        """No more groups: wake every waiter (get_batch raises when it cannot be filled)."""
        async with self._cond:
            self._closed = True
            self._cond.notify_all()

    # --- introspection / checkpoints ---------------------------------------------------

    def __len__(self) -> int:
        return len(self._groups)

    @property
    def closed(self) -> bool:
        return self._closed

    def metrics(self) -> dict[str, float]:
        """Counters plus the fill level, prefixed for the metrics log."""
        out: dict[str, float] = {f"buffer/{k}": float(v) for k, v in self.counters.items()}
        out["buffer/size"] = float(len(self._groups))
        return out

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable: the buffered groups, the counters and the learner version."""
        return {
            "groups": [g.to_dict() for g in self._groups],
            "counters": dict(self.counters),
            "learner_version": self.learner_version,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._groups = deque(TrajectoryGroup.from_dict(g) for g in state.get("groups", []))
        self.counters = dict.fromkeys(COUNTER_NAMES, 0)
        self.counters.update({k: int(v) for k, v in state.get("counters", {}).items()})
        self.learner_version = int(state.get("learner_version", self.learner_version))
