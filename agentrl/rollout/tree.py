"""The invariant ARPO branching promises: a branch shares its parent's prefix exactly.

Every trajectory of an ARPO group is a whole root-to-leaf path; a branch records its
``parent_id`` and ``branch_position`` (the token index where it leaves its parent). The
batch-row index of a tree (``parent``, ``branch_pos``) is built in one place,
:func:`agentrl.algos.tree_from_ids`, from the rows of :meth:`agentrl.types.Batch.from_groups`.
"""

from __future__ import annotations

from agentrl.types import TrajectoryGroup


def check_shared_prefixes(group: TrajectoryGroup) -> None:
    """Raise if any branch's first ``branch_position`` tokens differ from its parent's
    (ids, behaviour logprobs, versions or loss mask)."""
    by_id = {t.traj_id: t for t in group.trajectories}
    for t in group.trajectories:
        if t.parent_id is None:
            continue
        p = by_id[t.parent_id]
        n = t.branch_position or 0
        for name in ("input_ids", "behavior_logprobs", "versions", "loss_mask"):
            a, b = getattr(t, name)[:n], getattr(p, name)[:n]
            if a != b or len(a) != n:
                raise AssertionError(
                    f"branch {t.traj_id} differs from parent {p.traj_id} in {name} before "
                    f"its branch position {n}"
                )
