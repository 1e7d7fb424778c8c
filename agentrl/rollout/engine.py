"""The rollout engine: many episodes in flight, groups emitted to a sink as they complete.

    engine = RolloutEngine(env, sampler, renderer, resolve(cfg).rollout, params)
    await engine.produce(16, JsonlSink("out/trajectories.jsonl"))      # N groups, then stop

    send, recv = anyio.create_memory_object_stream[TrajectoryGroup](4)
    engine.cursor.load_state_dict(ckpt["cursor"])                      # resume point
    tg.start_soon(engine.produce, None, send)                          # bounded, backpressured

Tasks come from one :class:`~agentrl.rollout.tasks.TaskCursor` (the environment's `split`, one
pass, unless `tasks` or a cursor is given). Each sample of a group is an episode of the
built-in runner or of the configured workflow (``rollout.workflow``, see
:mod:`agentrl.rollout.workflow`); ARPO trees grow in the built-in runner.

Every episode runs under one anyio task group and holds a slot of a
:class:`anyio.CapacityLimiter` (``rollout.concurrency``); generation requests of all
episodes meet in the sampler's batching and tool calls of different episodes overlap.
Cancelling the caller cancels every episode; each one closes its environment (and so its
sandbox session) in a shielded ``finally``.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from agentrl.chat import Renderer, require_renderer
from agentrl.envs.program import AnyEnvironment
from agentrl.errors import ConfigError
from agentrl.rollout.episode import EpisodeLimits, EpisodeRunner, new_id
from agentrl.rollout.group import run_branching_group, run_group
from agentrl.rollout.hooks import resolve_group_hooks
from agentrl.rollout.settings import RolloutSettings, SamplingSettings
from agentrl.rollout.tasks import TaskCursor
from agentrl.rollout.workflow import BUILTIN, Workflow, resolve_workflow
from agentrl.samplers.base import Sampler, SamplingParams
from agentrl.types import Trajectory, TrajectoryGroup

GroupSink = Callable[[TrajectoryGroup], Awaitable[Any]] | MemoryObjectSendStream[TrajectoryGroup]


def _emitter(sink: GroupSink) -> Callable[[TrajectoryGroup], Awaitable[Any]]:
    if isinstance(sink, MemoryObjectSendStream):
        return sink.send
    if callable(sink):
        return sink
    raise TypeError(
        f"sink must be an async callable or an anyio MemoryObjectSendStream (got {type(sink).__name__})"
    )


def sampling_params_from(sampling: SamplingSettings | None, renderer: Renderer) -> SamplingParams:
    """Per-turn sampling params from the run's sampling settings (or defaults), stopping at
    the renderer's end-of-turn tokens."""
    if sampling is None:
        sampling = SamplingSettings()
    return SamplingParams(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        max_new_tokens=sampling.max_new_tokens,
        stop_token_ids=tuple(renderer.stop_token_ids),
        seed=sampling.seed,
    )


class RolloutEngine:
    """Produces :class:`TrajectoryGroup` s from a task stream, concurrently.

    ``data_cursor`` is the resume point: every task before it has been emitted (tasks in
    flight at a checkpoint are re-run after a resume, never skipped).
    """

    def __init__(
        self,
        env: AnyEnvironment,
        sampler: Sampler,
        renderer: Renderer,
        settings: RolloutSettings,
        params: SamplingParams | None = None,
        *,
        sampling: SamplingSettings | None = None,
        seed: int | None = None,
        tasks: Iterable[dict[str, Any]] | None = None,
        split: str = "train",
        context_length: int | None = None,
        vocab_size: int | None = None,
        workflow: Workflow | None = None,
    ) -> None:
        """Sampling params come from `params`, else from `sampling` (default: the
        settings' own), with the renderer's end-of-turn tokens as stop tokens; `seed`
        replaces the settings' seed."""
        config = settings
        renderer = require_renderer(renderer)
        if params is None:
            params = sampling_params_from(sampling or settings.sampling, renderer)
            params = params.with_(stop=tuple(params.stop) + env.stop_strings())
        self.env = env
        self.sampler = sampler
        self.config = config
        seed = settings.seed if seed is None else seed
        self.seed = seed
        ctx = context_length if context_length is not None else sampler.context_length
        self.limits = EpisodeLimits.from_settings(config, context_length=ctx)
        self.branching = config.branching if config.branching.enabled else None
        self.runner = EpisodeRunner(env, sampler, renderer, params, self.limits)
        self._vocab_size = vocab_size
        self.limiter = anyio.CapacityLimiter(config.concurrency)
        self.workflow: Workflow | None = workflow or resolve_workflow(config.workflow)
        if self.workflow is not None and self.branching is not None:
            raise ConfigError(
                f"rollout.branching grows ARPO trees inside the built-in episode runner; set "
                f"rollout.workflow={BUILTIN} (got {config.workflow!r}) or turn branching off"
            )
        self.cursor = (
            TaskCursor.over(tasks)
            if tasks is not None
            else TaskCursor.for_env(env, seed, split, epochs=1)
        )
        self.groups_emitted = 0
        self.group_hooks = resolve_group_hooks(list(config.group_hooks))

    @property
    def group_width(self) -> int:
        """Trajectories per group: G, or the branching budget M."""
        return self.branching.budget if self.branching else self.config.group_size

    @property
    def max_groups_in_flight(self) -> int:
        # enough groups to keep every episode slot busy, and one more to fill gaps
        return math.ceil(self.config.concurrency / self.group_width) + 1

    # --- groups ----------------------------------------------------------------------------

    async def run_task(
        self, task: dict[str, Any], index: int = 0, group_id: str | None = None
    ) -> TrajectoryGroup:
        """One group for `task` (G samples, or an ARPO tree when branching is on)."""
        seed = (self.seed * 1_000_003 + index) % (2**31)
        gid = group_id or f"g{index}-{new_id()}"
        if self.branching is not None:
            if self._vocab_size is None:
                self._vocab_size = self.sampler.vocab_size
            group = await run_branching_group(
                task,
                self.runner,
                self.branching,
                self.limiter,
                self._vocab_size,
                seed=seed,
                group_id=gid,
            )
        else:
            group = await run_group(
                task,
                self.runner,
                self.config.group_size,
                self.limiter,
                seed=seed,
                group_id=gid,
                workflow=self.workflow,
            )
        group.metadata["task_index"] = index
        for n_hook, hook in enumerate(self.group_hooks):

            async def more(task: dict[str, Any], n: int, _g=group, _h=n_hook) -> list[Trajectory]:
                extra = await run_group(
                    task,
                    self.runner,
                    n,
                    self.limiter,
                    seed=(seed * 31 + _h + 1) % (2**31),
                    group_id=f"{_g.group_id}-h{_h}",
                    workflow=self.workflow,
                )
                for i, t in enumerate(extra.trajectories):
                    t.group_id, t.traj_id = _g.group_id, f"{_g.group_id}-h{_h}-{i}"
                return extra.trajectories

            group = await hook(group, more)
        return group

    async def produce(self, n_groups: int | None, sink: GroupSink) -> int:
        """Emit `n_groups` groups to `sink` (all of them when None; fewer if the tasks run
        out), then return how many. Does not close `sink`; cancelling the caller stops it."""
        if n_groups is not None and n_groups < 0:
            raise ValueError(f"n_groups must be >= 0 or None (got {n_groups})")
        emit = _emitter(sink)
        slots = anyio.Semaphore(self.max_groups_in_flight)
        emitted_here = 0

        async def one(task: dict[str, Any], index: int) -> None:
            nonlocal emitted_here
            try:
                group = await self.run_task(task, index)
                await emit(group)  # blocks while a bounded stream is full: backpressure
                emitted_here += 1
                self.groups_emitted += 1
                self.cursor.settle(index)
            finally:
                slots.release()

        async with anyio.create_task_group() as tg:
            started = 0
            while n_groups is None or started < n_groups:
                await slots.acquire()
                taken = self.cursor.take()
                if taken is None:
                    slots.release()
                    break
                started += 1
                tg.start_soon(one, taken[1], taken[0])
        return emitted_here

    async def collect(self, n_groups: int) -> list[TrajectoryGroup]:
        """Convenience: produce `n_groups` and return them (in completion order)."""
        out: list[TrajectoryGroup] = []

        async def append(g: TrajectoryGroup) -> None:
            out.append(g)

        await self.produce(n_groups, append)
        return out
