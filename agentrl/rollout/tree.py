"""Branch trees as tensors: what tree advantage attribution needs from a group.

Every trajectory of an ARPO group is a whole root-to-leaf path; a branch records its
``parent_id`` and ``branch_position`` (the token index where it leaves its parent). For a
batch, ``parent_index[b]`` is the row of b's parent (-1 for roots) and
``branch_pos[b]`` the token where b starts to differ from it (0 for roots): tokens
``[0, branch_pos[b])`` of row b are the same tokens as in row ``parent_index[b]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrl.types import TrajectoryGroup


def tree_index(groups: Sequence[TrajectoryGroup]) -> tuple[list[int], list[int]]:
    """(parent_index, branch_pos) per row, rows in :meth:`Batch.from_groups` order."""
    parent_index: list[int] = []
    branch_pos: list[int] = []
    offset = 0
    for g in groups:
        rows = {t.traj_id: offset + i for i, t in enumerate(g.trajectories)}
        for t in g.trajectories:
            if t.parent_id is None:
                parent_index.append(-1)
                branch_pos.append(0)
                continue
            if t.parent_id not in rows:
                raise ValueError(
                    f"trajectory {t.traj_id!r} names parent {t.parent_id!r}, which is not in "
                    f"group {g.group_id!r}: keep whole trees together in a batch"
                )
            if t.branch_position is None:
                raise ValueError(f"branch {t.traj_id!r} has a parent but no branch_position")
            parent_index.append(rows[t.parent_id])
            branch_pos.append(int(t.branch_position))
        offset += len(g.trajectories)
    return parent_index, branch_pos


def tree_tensors(groups: Sequence[TrajectoryGroup]) -> dict[str, Any]:
    """``{"parent_index": LongTensor[B], "branch_pos": LongTensor[B]}`` for a batch."""
    import torch

    parent_index, branch_pos = tree_index(groups)
    return {
        "parent_index": torch.tensor(parent_index, dtype=torch.long),
        "branch_pos": torch.tensor(branch_pos, dtype=torch.long),
    }


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
