"""Group hooks: act on a finished group before it reaches the buffer.

    @register_group_hook("my_hook")
    async def my_hook(group: TrajectoryGroup, ctx: GroupHookContext, **options) -> TrajectoryGroup:
        if all(r <= 0 for r in group.rewards):
            extra = await ctx.run({**group.task, "question": "..."}, n=2)
            ...
        return group

Configs list them in ``rollout.group_hooks`` (a registered name or ``module:function``,
with ``options``); they run in order on every group the engine produces. ``ctx.run``
samples more episodes of a (possibly changed) task into the same group; ``ctx.state`` is
the hook's own dict, kept for the engine's lifetime (a replay store). Every trajectory a
hook adds or replaces carries ``metadata["group_hook"]`` (its name) and the group lists the
hooks that changed it in ``metadata["group_hooks"]``, so traces show what was not a plain
sample. Built-ins:

* ``ghpo_hint`` -- GHPO (Liu et al. 2025, arXiv 2507.10628): a group where every sample
  failed is sampled again with part of the task's reference solution appended as a hint.
* ``replay``    -- ARPO-GUI-style experience replay (Lu et al. 2025): the best successful
  trajectory seen for a task is replayed into a later group of that task where every sample
  failed, replacing its worst sample. Its tokens keep their old versions: the staleness gate
  skips replayed rows and the off-policy correction (``algorithm.off_policy``) weights them.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.errors import ConfigError
from agentrl.registry import Registry, load_object
from agentrl.types import Trajectory, TrajectoryGroup

GroupHook = Callable[..., Awaitable[TrajectoryGroup]]
GROUP_HOOKS: Registry[GroupHook] = Registry("group_hook")


def register_group_hook(name: str, *, override: bool = False) -> Callable[[GroupHook], GroupHook]:
    """Register ``async fn(group, ctx, **options) -> group``."""
    return GROUP_HOOKS.register(name, override=override)


@dataclass
class GroupHookContext:
    """What a hook gets besides the group."""

    name: str
    # run(task, n) -> n new trajectories of `task` in the group (ids and group id set)
    run: Callable[[dict[str, Any], int], Awaitable[list[Trajectory]]]
    state: dict[str, Any] = field(default_factory=dict)


@dataclass
class BoundHook:
    """A resolved hook with its options and its own state."""

    name: str
    fn: GroupHook
    options: dict[str, Any]
    state: dict[str, Any] = field(default_factory=dict)

    async def __call__(
        self,
        group: TrajectoryGroup,
        run: Callable[[dict[str, Any], int], Awaitable[list[Trajectory]]],
    ) -> TrajectoryGroup:
        ctx = GroupHookContext(self.name, run, self.state)
        before = [id(t) for t in group.trajectories]
        out = await self.fn(group, ctx, **self.options)
        changed = [t for t in out.trajectories if id(t) not in before]
        for t in changed:
            t.metadata.setdefault("group_hook", self.name)
        if changed:
            out.metadata.setdefault("group_hooks", []).append(self.name)
        return out


def resolve_group_hooks(specs: list[Any]) -> list[BoundHook]:
    """``rollout.group_hooks`` entries (a name, or an object with ``name`` and ``options``)
    as hooks; unknown names and unknown options fail here, naming the entry."""
    hooks = []
    for i, spec in enumerate(specs):
        name = spec if isinstance(spec, str) else spec.name
        options = {} if isinstance(spec, str) else dict(spec.options)
        fn = load_object(name, "group hook") if ":" in name else GROUP_HOOKS.get(name)
        params = inspect.signature(fn).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        known = [n for n in list(params)[2:] if params[n].kind is not inspect.Parameter.VAR_KEYWORD]
        for key in options:
            if not takes_any and key not in known:
                raise ConfigError(
                    f"rollout.group_hooks[{i}] ({name}): unknown option {key!r}; it takes "
                    f"{', '.join(known) or 'no options'}"
                )
        hooks.append(BoundHook(name, fn, options))
    return hooks


def _all_failed(group: TrajectoryGroup, success: float) -> bool:
    valid = group.valid()
    return bool(valid) and all(t.reward < success for t in valid)


# GHPO (Liu et al. 2025, sec. 3.2): an all-fail group is resampled with a partial solution
@register_group_hook("ghpo_hint")
async def ghpo_hint(
    group: TrajectoryGroup,
    ctx: GroupHookContext,
    *,
    success: float = 1.0,
    solution_key: str = "solution",
    prompt_key: str = "question",
    fraction: float = 0.5,
) -> TrajectoryGroup:
    """Resample an all-fail group (every valid reward < `success`) with the first
    `fraction` of ``task[solution_key]`` appended to ``task[prompt_key]`` as a hint; the
    hinted samples replace the failed ones. Tasks without a solution are left alone."""
    if not 0.0 < fraction <= 1.0:
        raise ConfigError(f"ghpo_hint fraction must be in (0, 1] (got {fraction})")
    task = group.task
    solution = str(task.get(solution_key) or "")
    if not solution or prompt_key not in task or not _all_failed(group, success):
        return group
    hint = solution[: max(1, math.ceil(fraction * len(solution)))]
    hinted = {**task, prompt_key: f"{task[prompt_key]}\n\nHint: {hint}"}
    fresh = await ctx.run(hinted, len(group.trajectories))
    for t in fresh:
        t.metadata["hint"] = hint
    group.trajectories = fresh
    return group


# ARPO-GUI experience replay (Lu et al. 2025, sec. 3.3): a stored success into an all-fail group
@register_group_hook("replay")
async def replay(
    group: TrajectoryGroup, ctx: GroupHookContext, *, success: float = 1.0
) -> TrajectoryGroup:
    """Store each task's best success; replay it into a later all-fail group of that task
    in place of the lowest-reward sample."""
    store: dict[str, dict[str, Any]] = ctx.state.setdefault("successes", {})
    valid = group.valid()
    if not valid or group.is_tree:  # a tree's rows are linked: nothing is swapped there
        return group
    best = max(valid, key=lambda t: t.reward)
    if best.reward >= success:
        kept = store.get(group.task_id)
        if kept is None or best.reward >= kept["reward"]:
            store[group.task_id] = best.to_dict()
        return group
    kept = store.get(group.task_id)
    if kept is None:
        return group
    replayed = Trajectory.from_dict(kept)
    replayed.metadata["replayed_from"] = replayed.traj_id
    replayed.traj_id = f"{group.group_id}-replay"
    replayed.group_id = group.group_id
    replayed.parent_id, replayed.branch_position = None, None
    worst = min(range(len(group.trajectories)), key=lambda i: _rank(group.trajectories[i]))
    group.trajectories[worst] = replayed
    return group


def _rank(traj: Trajectory) -> float:
    """Infra failures go first, then the lowest reward."""
    return -math.inf if traj.status == "infra_error" else traj.reward
