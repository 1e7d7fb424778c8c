"""One task's group of samples: G independent episodes, or an ARPO branch tree.

ARPO (arXiv 2507.19849), per task: a budget of M trajectories, N of them started as
ordinary samples. After each tool result, the entropy of the first k tokens the model
generates after *that* result, normalised by ln|V|, is compared with the episode's own
initial k tokens: ΔH = H_post - H_init. The episode forks Z continuations from the point
right after the tool result with probability clamp(α + β·ΔH, 0, 1) (``stochastic``) or
whenever α + β·ΔH > τ (``threshold``), while budget remains. When every path has ended
and budget is left, fresh samples top the group up to M. See docs/arpo.md.
"""

from __future__ import annotations

import math
import random
from typing import Any

import anyio

from agentrl.rollout.episode import (
    EpisodeRunner,
    EpisodeState,
    Snapshot,
    mean_entropy,
    new_id,
    run_attempts,
)
from agentrl.rollout.settings import BranchingSettings
from agentrl.rollout.workflow import Workflow, episode_function
from agentrl.samplers.base import Generation
from agentrl.types import Trajectory, TrajectoryGroup


def decide_branch(
    policy: BranchingSettings, delta_h: float, rng: random.Random
) -> tuple[bool, float]:
    """(branch?, probability or score) for an entropy change ΔH: the score is
    α + β·ΔH, a probability clamped to [0, 1] (``stochastic``) or compared with τ
    (``threshold``)."""
    s = policy.alpha + policy.beta * delta_h
    if policy.mode == "threshold":
        return s > policy.tau, s
    p = min(max(s, 0.0), 1.0)
    return rng.random() < p, p


def _seed(base: int | None, index: int) -> int | None:
    return None if base is None else (base * 7919 + index) % (2**31)


async def run_group(
    task: dict[str, Any],
    runner: EpisodeRunner,
    group_size: int,
    limiter: anyio.CapacityLimiter,
    *,
    seed: int | None = None,
    group_id: str | None = None,
    workflow: Workflow | None = None,
) -> TrajectoryGroup:
    """G independent samples of `task`, run concurrently (each holds a `limiter` slot),
    by the built-in episode runner or by `workflow`."""
    gid = group_id or new_id()
    task_id = str(task.get("id", ""))
    out: list[list[Trajectory]] = [[] for _ in range(group_size)]
    episode = episode_function(workflow, runner, task)

    async def one(i: int) -> None:
        template = Trajectory(task_id=task_id, group_id=gid, traj_id=f"{gid}-{i}")
        async with limiter:
            result = await episode(template, _seed(seed, i))
        out[i] = result if isinstance(result, list) else [result]

    async with anyio.create_task_group() as tg:
        for i in range(group_size):
            tg.start_soon(one, i)
    trajs = [t for samples in out for t in samples]
    return TrajectoryGroup(task_id=task_id, trajectories=trajs, task=task, group_id=gid)


async def run_branching_group(
    task: dict[str, Any],
    runner: EpisodeRunner,
    policy: BranchingSettings,
    limiter: anyio.CapacityLimiter,
    vocab_size: int,
    *,
    seed: int | None = None,
    group_id: str | None = None,
) -> TrajectoryGroup:
    """An ARPO tree of exactly ``policy.budget`` trajectories for `task`.

    All decision state (budget used, RNG) lives in this call: nothing carries over to the
    next group or training step.
    """
    gid = group_id or new_id()
    task_id = str(task.get("id", ""))
    rng = random.Random(seed)
    ln_v = math.log(vocab_size)
    k = policy.entropy_window
    trajs: list[Trajectory | None] = []
    stats = {"branch_points": 0, "branched": 0, "top_up": 0}

    def reserve(n: int) -> list[int]:
        free = policy.budget - len(trajs)
        idx = list(range(len(trajs), len(trajs) + min(n, free)))
        trajs.extend([None] * len(idx))
        return idx

    async def episode(i: int, template: Trajectory, make: Any, tg: anyio.abc.TaskGroup) -> None:
        async def hook(state: EpisodeState, snap: Snapshot, gen: Generation) -> None:
            await on_tool_result(state, snap, gen, tg)

        async with limiter:
            trajs[i] = await run_attempts(runner, make, template, branch_hook=hook, entropy_k=k)

    def start_root(i: int, tg: anyio.abc.TaskGroup) -> None:
        template = Trajectory(task_id=task_id, group_id=gid, traj_id=f"{gid}-{i}")
        s = _seed(seed, i)
        tg.start_soon(episode, i, template, lambda t: runner.start(task, t, s), tg)

    async def on_tool_result(
        state: EpisodeState, snap: Snapshot, gen: Generation, tg: anyio.abc.TaskGroup
    ) -> None:
        h_post = mean_entropy(gen.entropies, k)  # after the CURRENT tool result
        if h_post is None or state.initial_entropy is None:
            return
        delta_h = (h_post - state.initial_entropy) / ln_v
        branch, p = decide_branch(policy, delta_h, rng)
        point = {
            "position": snap.position,
            "h_post": h_post / ln_v,
            "delta_h": delta_h,
            "score" if policy.mode == "threshold" else "p": p,
            "branch": branch,
            "children": [],
        }
        state.traj.metadata.setdefault("branch_points", []).append(point)
        stats["branch_points"] += 1
        if not branch:
            return
        for i in reserve(policy.branches):
            child_id = f"{gid}-{i}"
            template = Trajectory(
                task_id=task_id,
                group_id=gid,
                traj_id=child_id,
                parent_id=state.traj.traj_id,
                branch_position=snap.position,
            )
            point["children"].append(child_id)
            stats["branched"] += 1
            s = _seed(seed, i)

            async def make(t: Trajectory, snap: Snapshot = snap, s: int | None = s) -> EpisodeState:
                child = await runner.fork(task, snap, t)
                child.seed = s
                return child

            tg.start_soon(episode, i, template, make, tg)

    first = True
    while len(trajs) < policy.budget:
        async with anyio.create_task_group() as tg:
            n = policy.initial if first else policy.budget - len(trajs)
            if not first:
                stats["top_up"] += n
            for i in reserve(n):
                start_root(i, tg)
        first = False
    done = [t for t in trajs if t is not None]
    return TrajectoryGroup(
        task_id=task_id, trajectories=done, task=task, group_id=gid, metadata={"arpo": stats}
    )
