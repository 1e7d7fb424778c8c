"""Preference pairs from the platform's own rollouts.

* :func:`group_pair`: the best against the worst trajectory of a group (online DPO); a
  group whose best and worst rewards are within ``min_gap`` (a tie) gives no pair, and
  ``infra_error`` episodes never take part.
* :func:`step_pairs`: Step-DPO pairs from an ARPO branch tree. A branch leaves its parent at
  ``branch_position`` and shares every token before it; the parent and the branches that
  leave it at the same position form one fork, and its best and worst paths (by reward)
  give a pair whose loss mask keeps only model tokens *after* the fork.

Both keep the sampled tokens as they are (token in, token out); the masks are the
trajectories' own (1 exactly on model tokens).
"""

from __future__ import annotations

from collections import defaultdict

from agentrl.preference.data import Completion, PreferencePair
from agentrl.types import Trajectory, TrajectoryGroup


def _completion(traj: Trajectory, start: int = 0) -> Completion:
    mask = [0] * start + traj.loss_mask[start:]
    return Completion(traj.input_ids, mask)


def _best_worst(trajs: list[Trajectory], min_gap: float) -> tuple[Trajectory, Trajectory] | None:
    ok = [t for t in trajs if t.status != "infra_error"]
    if len(ok) < 2:
        return None
    best = max(ok, key=lambda t: t.reward)
    worst = min(ok, key=lambda t: t.reward)
    if best.reward - worst.reward <= min_gap:
        return None  # a tie: nothing to prefer
    return best, worst


def group_pair(
    group: TrajectoryGroup, min_gap: float = 0.0, roots_only: bool = True
) -> PreferencePair | None:
    """Best vs worst of `group` (its roots, for a tree), or None for a tie."""
    trajs = [t for t in group.trajectories if not (roots_only and t.parent_id is not None)]
    found = _best_worst(trajs, min_gap)
    if found is None:
        return None
    best, worst = found
    if not any(best.loss_mask) or not any(worst.loss_mask):
        return None
    where = f"group {group.group_id or group.task_id}: {best.traj_id} > {worst.traj_id}"
    return PreferencePair(_completion(best), _completion(worst), where)


def step_pairs(group: TrajectoryGroup, min_gap: float = 0.0) -> list[PreferencePair]:
    """Step-DPO pairs from the forks of an ARPO tree (see the module docstring)."""
    by_id = {t.traj_id: t for t in group.trajectories}
    forks: dict[tuple[str, int], list[Trajectory]] = defaultdict(list)
    for t in group.trajectories:
        if t.parent_id is None or t.parent_id not in by_id:
            continue
        forks[(t.parent_id, int(t.branch_position or 0))].append(t)
    pairs = []
    for (parent_id, fork), branches in sorted(forks.items()):
        parent = by_id[parent_id]
        found = _best_worst([parent, *branches], min_gap)
        if found is None:
            continue
        best, worst = found
        if best.input_ids[:fork] != worst.input_ids[:fork]:
            raise ValueError(
                f"group {group.group_id}: {best.traj_id} and {worst.traj_id} do not share "
                f"their first {fork} tokens: not a branch tree"
            )
        chosen, rejected = _completion(best, fork), _completion(worst, fork)
        if chosen.trained and rejected.trained:
            where = (
                f"group {group.group_id} fork {parent_id}@{fork}: {best.traj_id} > {worst.traj_id}"
            )
            pairs.append(PreferencePair(chosen, rejected, where))
    return pairs


def pairs_from_groups(
    groups: list[TrajectoryGroup], min_gap: float = 0.0, step_level: bool = True
) -> tuple[list[PreferencePair], int]:
    """(pairs, groups skipped as ties): one best-vs-worst pair per group, plus the step
    pairs of tree groups when `step_level`."""
    pairs, ties = [], 0
    for g in groups:
        pair = group_pair(g, min_gap)
        if pair is None:
            ties += 1
        else:
            pairs.append(pair)
        if step_level and g.is_tree:
            pairs.extend(step_pairs(g, min_gap))
    return pairs, ties
