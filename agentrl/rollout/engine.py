"""The rollout engine: many episodes in flight, groups emitted to a sink as they complete.

    engine = RolloutEngine(env, sampler, renderer, cfg.rollout, params)
    await engine.produce(16, JsonlSink("out/trajectories.jsonl"))      # N groups, then stop

    send, recv = anyio.create_memory_object_stream[TrajectoryGroup](4)
    engine.set_tasks(env.tasks("train", seed), cursor=ckpt["data_cursor"])
    tg.start_soon(engine.run_forever, send)                            # bounded, backpressured

Every episode runs under one anyio task group and holds a slot of a
:class:`anyio.CapacityLimiter` (``rollout.concurrency``); generation requests of all
episodes meet in the sampler's batching and tool calls of different episodes overlap.
Cancelling the caller cancels every episode; each one closes its environment (and so its
sandbox session) in a shielded ``finally``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from agentrl.chat import Renderer, require_renderer
from agentrl.envs.base import Environment
from agentrl.rollout.episode import EpisodeLimits, EpisodeRunner, new_id
from agentrl.rollout.group import BranchPolicy, run_branching_group, run_group
from agentrl.samplers.base import Sampler, SamplingParams
from agentrl.types import TrajectoryGroup

GroupSink = Callable[[TrajectoryGroup], Awaitable[Any]] | MemoryObjectSendStream[TrajectoryGroup]


def _emitter(sink: GroupSink) -> Callable[[TrajectoryGroup], Awaitable[Any]]:
    if isinstance(sink, MemoryObjectSendStream):
        return sink.send
    if callable(sink):
        return sink
    raise TypeError(
        f"sink must be an async callable or an anyio MemoryObjectSendStream (got {type(sink).__name__})"
    )


def sampling_params_from(sampler_cfg: Any, renderer: Renderer) -> SamplingParams:
    """Per-turn sampling params from a :class:`agentrl.config.SamplerConfig` (or defaults),
    stopping at the renderer's end-of-turn tokens."""
    if sampler_cfg is None:
        from agentrl.config import SamplerConfig

        sampler_cfg = SamplerConfig()
    return SamplingParams(
        temperature=sampler_cfg.temperature,
        top_p=sampler_cfg.top_p,
        top_k=sampler_cfg.top_k,
        max_new_tokens=sampler_cfg.max_new_tokens,
        stop_token_ids=tuple(renderer.stop_token_ids),
    )


class RolloutEngine:
    """Produces :class:`TrajectoryGroup` s from a task stream, concurrently.

    ``data_cursor`` is the resume point: every task before it has been emitted (tasks in
    flight at a checkpoint are re-run after a resume, never skipped).
    """

    def __init__(
        self,
        env: Environment,
        sampler: Sampler,
        renderer: Renderer,
        cfg: Any,
        params: SamplingParams | None = None,
        *,
        sampler_cfg: Any = None,
        seed: int = 0,
        tasks: Iterable[dict[str, Any]] | None = None,
        split: str = "train",
        context_length: int | None = None,
        vocab_size: int | None = None,
    ) -> None:
        """`cfg` is a :class:`agentrl.config.RolloutConfig`; sampling params come from
        `params`, else from `sampler_cfg` (a :class:`SamplerConfig`), with the renderer's
        end-of-turn tokens as stop tokens."""
        config = cfg
        renderer = require_renderer(renderer)
        if params is None:
            params = sampling_params_from(sampler_cfg, renderer)
        self.env = env
        self.sampler = sampler
        self.config = config  # agentrl.config.RolloutConfig
        self.seed = seed
        ctx = context_length if context_length is not None else sampler.context_length
        self.limits = EpisodeLimits.from_config(config, context_length=ctx)
        self.branching = (
            BranchPolicy.from_config(config.branching) if config.branching.enabled else None
        )
        self.runner = EpisodeRunner(env, sampler, renderer, params, self.limits)
        self._vocab_size = vocab_size
        self.limiter = anyio.CapacityLimiter(config.concurrency)
        self._tasks: Iterator[dict[str, Any]] | None = None
        self._task_source = tasks
        self._split = split
        self._next_index = 0
        self._done: set[int] = set()
        self._low_watermark = 0
        self.groups_emitted = 0

    # --- tasks and the data cursor -------------------------------------------------------

    def set_tasks(self, tasks: Iterable[dict[str, Any]], cursor: int = 0) -> None:
        """Use `tasks`, skipping the first `cursor` (a checkpoint's ``data_cursor``)."""
        if cursor < 0:
            raise ValueError(f"cursor must be >= 0 (got {cursor})")
        self._tasks = itertools.islice(iter(tasks), cursor, None)
        self._next_index = cursor
        self._low_watermark = cursor
        self._done = set()

    @property
    def data_cursor(self) -> int:
        """Number of tasks consumed whose groups have all been emitted (in order)."""
        return self._low_watermark

    @property
    def tasks_started(self) -> int:
        return self._next_index

    @property
    def group_width(self) -> int:
        """Trajectories per group: G, or the branching budget M."""
        return self.branching.budget if self.branching else self.config.group_size

    @property
    def max_groups_in_flight(self) -> int:
        # enough groups to keep every episode slot busy, and one more to fill gaps
        return math.ceil(self.config.concurrency / self.group_width) + 1

    def _task_iter(self) -> Iterator[dict[str, Any]]:
        if self._tasks is None:
            source = self._task_source
            if source is None:
                source = self.env.tasks(self._split, self.seed)
            self.set_tasks(source, 0)
        assert self._tasks is not None
        return self._tasks

    def _mark_done(self, index: int) -> None:
        self._done.add(index)
        while self._low_watermark in self._done:
            self._done.discard(self._low_watermark)
            self._low_watermark += 1

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
                task, self.runner, self.config.group_size, self.limiter, seed=seed, group_id=gid
            )
        group.metadata["task_index"] = index
        return group

    async def run_group(
        self, task: dict[str, Any], group_id: str | None = None, index: int | None = None
    ) -> TrajectoryGroup:
        """One group for `task` outside the task stream (the orchestrator's entry point)."""
        if index is None:
            index = self._next_index
        group = await self.run_task(task, index, group_id=group_id)
        return group

    async def _produce(self, n_groups: int | None, sink: GroupSink) -> int:
        emit = _emitter(sink)
        slots = anyio.Semaphore(self.max_groups_in_flight)
        tasks = self._task_iter()
        emitted_here = 0

        async def one(task: dict[str, Any], index: int) -> None:
            nonlocal emitted_here
            try:
                group = await self.run_task(task, index)
                await emit(group)  # blocks while a bounded stream is full: backpressure
                emitted_here += 1
                self.groups_emitted += 1
                self._mark_done(index)
            finally:
                slots.release()

        async with anyio.create_task_group() as tg:
            started = 0
            while n_groups is None or started < n_groups:
                await slots.acquire()
                task = next(tasks, None)
                if task is None:
                    slots.release()
                    break
                index = self._next_index
                self._next_index += 1
                started += 1
                tg.start_soon(one, task, index)
        return emitted_here

    async def produce(self, n_groups: int, sink: GroupSink) -> int:
        """Emit `n_groups` groups (fewer if the tasks run out) to `sink`, then return."""
        if n_groups < 0:
            raise ValueError(f"n_groups must be >= 0 (got {n_groups})")
        return await self._produce(n_groups, sink)

    async def run_forever(self, sink: GroupSink) -> int:
        """Emit groups until the tasks run out or the caller cancels. Does not close `sink`."""
        return await self._produce(None, sink)

    async def collect(self, n_groups: int) -> list[TrajectoryGroup]:
        """Convenience: produce `n_groups` and return them (in completion order)."""
        out: list[TrajectoryGroup] = []

        async def append(g: TrajectoryGroup) -> None:
            out.append(g)

        await self.produce(n_groups, append)
        return out
