"""The orchestrator: builds a run from a config and drives the event-driven loop.

    tasks ─▶ producer (rollout groups) ─▶ Buffer ─▶ learner step ─▶ WeightBus ─▶ samplers

One knob sets the mode. The producer may run ahead of the learner by
``(max_staleness + 1) * batch_groups`` groups: a permit is taken when a group starts and
given back when the learner has trained on it and published the next weights (or when the
buffer drops it). With ``max_staleness: 0`` this is a barrier (synchronous, on-policy);
with ``k`` the sampler overlaps the learner and no admitted group is more than ``k``
versions old when it is trained. The producer also never starts more groups than the
remaining steps can train (plus replacements for dropped ones): the last steps of a run do
not share the machine with rollouts nobody will train on. Everything runs under one anyio
task group: if any part fails, the rest is cancelled and the last checkpoint stays
consistent.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from agentrl.config import Config
from agentrl.cpu import set_allocator, set_threads
from agentrl.errors import CheckpointError
from agentrl.events import (
    BatchTrained,
    CheckpointSaved,
    EventBus,
    GroupDropped,
    GroupFinished,
    JsonlMetrics,
    ProgressDisplay,
    RunFinished,
    RunStarted,
    TensorBoardWriter,
    TraceWriter,
    WeightsPublished,
    summarize_group,
)
from agentrl.types import TrajectoryGroup

log = logging.getLogger("agentrl.orchestrator")

CHECKPOINTS = "checkpoints"
LATEST = "latest"


@dataclass
class DataCursor:
    """Which tasks have been handed out; in-flight ones are re-issued after a resume."""

    next_index: int = 0
    reissue: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"next_index": self.next_index, "reissue": list(self.reissue)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DataCursor:
        return cls(next_index=int(d["next_index"]), reissue=[int(i) for i in d.get("reissue", [])])


class TaskStream:
    """Indexable, endless view of an environment's train tasks (re-seeded per epoch)."""

    def __init__(self, env: Any, seed: int) -> None:
        self._env = env
        self._seed = seed
        self._epoch = -1
        self._cache: list[dict[str, Any]] = []
        self._epoch_len: int | None = None
        self._iter: Iterator[dict[str, Any]] | None = None

    def get(self, index: int) -> dict[str, Any]:
        # tasks are generated lazily and memoised so a resumed run sees the same order
        while index >= len(self._cache):
            if self._iter is None:
                self._epoch += 1
                self._iter = iter(self._env.tasks(split="train", seed=self._seed + self._epoch))
            try:
                self._cache.append(next(self._iter))
            except StopIteration:
                if self._epoch_len is None:
                    self._epoch_len = len(self._cache)
                    if self._epoch_len == 0:
                        from agentrl.errors import DatasetError

                        raise DatasetError("the environment produced no training tasks") from None
                self._iter = None
        return self._cache[index]


class Orchestrator:
    """Owns every component of a training run."""

    def __init__(self, cfg: Config, run_dir: str | Path, resume: bool = False) -> None:
        self.cfg = cfg
        # before any worker thread starts: threads that allocated already keep their arena
        set_allocator(cfg.orchestrator.cpu_allocator)
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.step = 0
        self.cursor = DataCursor()
        self.events = EventBus()
        self._inflight: set[int] = set()
        self._permits: anyio.Semaphore | None = None
        # groups the remaining steps still need started: a started group takes one, a
        # dropped or evicted group gives it back (its replacement is needed)
        self._wanted = 0
        self._wanted_more = anyio.Event()
        self._stop_reason = "completed"
        self._rollout_tokens = 0
        self._finished: list[dict[str, float]] = []  # every group finished since the last step
        self._rollout_t0 = time.time()
        self._saved_step = 0
        self._prefill_seen = (0, 0)  # sampler's (forwarded, reused) prompt tokens so far

    # --- construction ------------------------------------------------------------

    def build(self) -> None:
        """Load the model twice (learner copy, sampler copy), the env, the rollout, the learner."""
        try:
            self._build()
        except BaseException:
            if hasattr(self, "learner"):
                self.close()  # no learner process outlives a failed build
            raise

    def _build(self) -> None:
        from agentrl.buffer import Buffer
        from agentrl.chat import ChatRenderer
        from agentrl.envs import make_env
        from agentrl.learner import Learner
        from agentrl.models import load_model, load_tokenizer, prepare_files
        from agentrl.rollout import RolloutEngine
        from agentrl.samplers import create_sampler
        from agentrl.weights import WeightBus

        cfg = self.cfg
        _seed_everything(cfg.orchestrator.seed)
        asynchronous = cfg.orchestrator.max_staleness > 0
        set_threads(cfg.orchestrator.cpu_threads, asynchronous=asynchronous)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(cfg.to_yaml())

        self.env = make_env(cfg.env.name, **cfg.env.options)
        self.learner_worker = learner_worker(cfg)
        sampler_model = None
        sampler_dtype = None if cfg.model.dtype == "auto" else cfg.model.dtype
        if self.learner_worker == "process":
            from agentrl.learner.worker import LearnerProcess

            # the child loads its own copy of the model while this process loads the rest;
            # a conversion the model needs (first run of the embedded default) happens once
            prepare_files(cfg.model.name)
            self.learner = LearnerProcess(cfg, asynchronous=asynchronous)
            if cfg.sampler.backend == "hf":
                sampler_model, tokenizer = load_model(
                    cfg.model.name, dtype=sampler_dtype, seed=cfg.model.seed
                )
            else:
                tokenizer = load_tokenizer(cfg.model.name)
        else:
            policy, tokenizer = load_model(cfg.model.name, dtype="float32", seed=cfg.model.seed)
            self.learner = Learner(policy, tokenizer, cfg)
            self.learner.warmup()  # the process worker does this in its child
        self.tokenizer = tokenizer
        drain = cfg.sampler.drain_on_update or not cfg.orchestrator.partial_rollouts
        if cfg.sampler.backend == "hf":
            if sampler_model is None:
                sampler_model, _ = load_model(
                    cfg.model.name, dtype=sampler_dtype, seed=cfg.model.seed
                )
            self.sampler = create_sampler(
                "hf",
                model=(sampler_model, tokenizer),
                max_batch_size=cfg.sampler.max_batch_size,
                drain_on_update=drain,
                **cfg.sampler.options,
            )
        else:
            options = dict(cfg.sampler.options)
            if cfg.sampler.base_url:
                options["base_url"] = cfg.sampler.base_url
            if cfg.sampler.api_key:
                options["api_key"] = cfg.sampler.api_key
            self.sampler = create_sampler(cfg.sampler.backend, model=cfg.model.name, **options)
        self.weight_bus = WeightBus()
        self.weight_bus.register(self.sampler)
        self.renderer = ChatRenderer(
            tokenizer, tools=self.env.tool_schemas(), template=cfg.model.chat_template
        )
        self.rollout = RolloutEngine(
            self.env,
            self.sampler,
            self.renderer,
            cfg.rollout,
            sampler_cfg=cfg.sampler,
            seed=cfg.orchestrator.seed,
            split="train",
        )
        self.buffer = Buffer(
            max_staleness=cfg.orchestrator.max_staleness,
            dynamic_sampling=cfg.algorithm.dynamic_sampling,
            # never below the permits in flight, so put() only waits when the learner lags
            capacity=(cfg.orchestrator.max_staleness + 1) * cfg.learner.batch_groups,
            on_evict=self._evicted,
        )
        self.tasks = TaskStream(self.env, cfg.orchestrator.seed)

        self.events.subscribe(JsonlMetrics(self.run_dir / "metrics.jsonl"))
        if cfg.logging.trace:
            self.events.subscribe(TraceWriter(self.run_dir / "trajectories.jsonl"))
        if cfg.logging.tensorboard:
            self.events.subscribe(TensorBoardWriter(self.run_dir / "tensorboard"))
        if cfg.logging.progress:
            self.events.subscribe(ProgressDisplay(cfg.orchestrator.max_steps))

        if self.learner_worker == "process":
            self.learner.wait_ready()  # a child that cannot start fails the build, not the run
        if self.resume:
            self._load_checkpoint()

    def close(self) -> None:
        """Stop the learner process, if there is one (:meth:`run` does this when it ends)."""
        close = getattr(self.learner, "close", None)
        if close is not None:
            close()

    # --- the loop ----------------------------------------------------------------

    async def run(self) -> str:
        """Train until `max_steps`; returns the stop reason. Ctrl-C checkpoints and stops."""
        cfg = self.cfg
        self.events.publish(
            RunStarted(
                run_dir=str(self.run_dir),
                config=cfg.model_dump(mode="json"),
                resumed_from_step=self.step,
            )
        )
        ahead = (cfg.orchestrator.max_staleness + 1) * cfg.learner.batch_groups
        # groups restored into the buffer by a resume hold permits already
        self._permits = anyio.Semaphore(max(ahead - len(self.buffer), 0))
        remaining = max(cfg.orchestrator.max_steps - self.step, 0) * cfg.learner.batch_groups
        self._wanted = remaining - len(self.buffer)
        error: BaseException | None = None
        try:
            # samplers start from the learner's weights: the same initial weights on a fresh
            # run; restored ones after a resume
            if self.learner.version != self.sampler.version:
                await self._publish()
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch_signals, tg.cancel_scope)
                tg.start_soon(self._producer)
                await self._learner_loop()
                tg.cancel_scope.cancel()
        except BaseException as e:  # cancellation, component failure
            error = e
            if self._stop_reason == "completed":
                self._stop_reason = "interrupted" if _is_interrupt(e) else "error"
            raise
        finally:
            with anyio.CancelScope(shield=True):
                if self._stop_reason == "interrupted" and self.step > self._saved_step:
                    await anyio.to_thread.run_sync(self.save_checkpoint)
                await self.sampler.close()
                await anyio.to_thread.run_sync(self.close)
                from agentrl.tools.python import close_shared_sandboxes

                await close_shared_sandboxes()  # no sandbox process outlives the run
                self.events.publish(
                    RunFinished(
                        step=self.step,
                        reason=self._stop_reason,
                        error=None if error is None else repr(error),
                    )
                )
                self.events.close()
        return self._stop_reason

    async def _watch_signals(self, scope: anyio.CancelScope) -> None:
        """Ctrl-C / SIGTERM: finish the current step, checkpoint, stop everything."""
        import signal

        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                log.warning(
                    "received %s: finishing the current step and checkpointing",
                    signal.Signals(signum).name,
                )
                self._stop_reason = "interrupted"
                scope.cancel()
                return

    async def _producer(self) -> None:
        assert self._permits is not None
        async with anyio.create_task_group() as tg:
            while True:
                while self._wanted <= 0:  # enough groups for every remaining step
                    self._wanted_more = anyio.Event()
                    await self._wanted_more.wait()
                await self._permits.acquire()
                self._wanted -= 1  # only this loop takes from it, so it is still > 0 here
                index = self._next_task_index()
                tg.start_soon(self._run_group, index)

    def _next_task_index(self) -> int:
        if self.cursor.reissue:
            return self.cursor.reissue.pop(0)
        index = self.cursor.next_index
        self.cursor.next_index += 1
        return index

    async def _run_group(self, index: int) -> None:
        assert self._permits is not None
        task = self.tasks.get(index)
        # a task stays "in flight" (re-issued after a resume) until the buffer holds it
        self._inflight.add(index)
        try:
            group = await self.rollout.run_task(task, index=index)
            group.metadata["task_index"] = index
            self._rollout_tokens += sum(t.num_model_tokens for t in group.trajectories)
            self._finished.append(summarize_group(group))
            self.events.publish(GroupFinished(group=group, step=self.step))
            admission = await self.buffer.put(group)
            admitted, reason = admission.admitted, admission.reason
        finally:
            self._inflight.discard(index)
        if not admitted:
            self.events.publish(GroupDropped(task_id=group.task_id, reason=reason))
            self._replace(1)

    def _evicted(self, groups: list[TrajectoryGroup]) -> None:
        """The buffer evicted admitted groups that went stale."""
        self._replace(len(groups))

    def _replace(self, n: int) -> None:
        """`n` groups will not be trained (dropped or evicted): their permits go back so
        sampling continues, and a replacement is wanted for each."""
        self._wanted += n
        self._wanted_more.set()
        if self._permits is not None:  # None only before run(), which recounts both
            for _ in range(n):
                self._permits.release()

    async def _learner_loop(self) -> None:
        assert self._permits is not None
        cfg = self.cfg
        limit = cfg.orchestrator.time_limit_s
        started = time.time()
        while self.step < cfg.orchestrator.max_steps:
            if limit is not None and time.time() - started > limit:
                log.warning("time limit of %.0f s reached after step %d", limit, self.step)
                self._stop_reason = "time_limit"
                if self.step > self._saved_step:
                    await anyio.to_thread.run_sync(self.save_checkpoint)
                    self._saved_step = self.step
                return
            t_wait = time.time()
            groups = await self.buffer.get_batch(
                cfg.learner.batch_groups, learner_version=self.learner.version
            )
            # a step is atomic: once its groups left the buffer, it finishes (an interrupt
            # waits for it) so step counter, weights, version and checkpoint never disagree
            with anyio.CancelScope(shield=True):
                t0 = time.time()
                metrics = await anyio.to_thread.run_sync(self.learner.step, groups)
                metrics["train_seconds"] = time.time() - t0
                metrics["learner_wait_seconds"] = t0 - t_wait
                self.step += 1
                await self._publish()
                await self.buffer.set_learner_version(self.learner.version)  # may evict
                for _ in groups:
                    self._permits.release()
                metrics.update(self._rollout_metrics(groups))
                self.events.publish(
                    BatchTrained(step=self.step, version=self.learner.version, metrics=metrics)
                )
                every = cfg.orchestrator.checkpoint_every
                if (every and self.step % every == 0) or self.step == cfg.orchestrator.max_steps:
                    await anyio.to_thread.run_sync(self.save_checkpoint)
                    self._saved_step = self.step

    async def _publish(self) -> None:
        t0 = time.time()
        weights = self.learner.state_dict_for_sampler()
        await self.weight_bus.publish(self.learner.version, weights)
        self.events.publish(
            WeightsPublished(version=self.learner.version, seconds=time.time() - t0)
        )

    def _rollout_metrics(self, groups: list[TrajectoryGroup]) -> dict[str, float]:
        """Rollout numbers over every group that finished since the last step (also the ones
        the buffer dropped, so dynamic sampling cannot inflate the reward curve), plus the
        same numbers over the groups actually trained (``batch/*``).

        A step during which no group finished (async: the rollouts it trains were done
        before the previous step ended, as at the end of a run) has no rollout numbers; the
        trained groups are not a stand-in, since dynamic sampling picked them for mixed
        rewards."""
        out: dict[str, float] = {}
        window, self._finished = self._finished, []
        for k in window[0] if window else ():
            out[k] = sum(r[k] for r in window) / len(window)
        out["groups_finished"] = float(len(window))
        trained = [summarize_group(g) for g in groups]
        if trained:
            for k in ("reward_mean", "success_rate"):
                out[f"batch/{k}"] = sum(r[k] for r in trained) / len(trained)
        elapsed = max(time.time() - self._rollout_t0, 1e-6)
        out["rollout_tokens_per_s"] = self._rollout_tokens / elapsed
        self._rollout_tokens = 0
        self._rollout_t0 = time.time()
        stats = self.sampler.stats() if hasattr(self.sampler, "stats") else {}
        if "prefix_reused_tokens" in stats:  # the hf sampler's prefix reuse since the last step
            fed = stats["prefill_tokens"] - self._prefill_seen[0]
            reused = stats["prefix_reused_tokens"] - self._prefill_seen[1]
            out["sampler/prefix_reuse_frac"] = reused / max(fed + reused, 1)
            self._prefill_seen = (stats["prefill_tokens"], stats["prefix_reused_tokens"])
        out.update(self.buffer.metrics())
        return out

    # --- checkpoints ---------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        """Atomic: the checkpoint folder appears whole (or not at all), then `latest` moves.

        RNG states travel in the learner's part of the checkpoint."""
        from agentrl.learner.checkpoint import atomic_directory

        t0 = time.time()
        root = self.run_dir / CHECKPOINTS
        final = root / f"step_{self.step:06d}"
        cursor = DataCursor(
            next_index=self.cursor.next_index,
            reissue=sorted(set(self.cursor.reissue) | self._inflight),
        )
        state = {
            "step": self.step,
            "version": self.learner.version,
            "cursor": cursor.to_dict(),
            "buffer": self.buffer.state_dict(),
        }
        with atomic_directory(final) as tmp:
            self.learner.save_checkpoint(tmp / "learner")
            (tmp / "orchestrator.json").write_text(json.dumps(state))
        pointer_tmp = root / ".latest.tmp"
        pointer_tmp.write_text(final.name)
        os.replace(pointer_tmp, root / LATEST)
        self._prune_checkpoints(root, keep=2)
        self.events.publish(
            CheckpointSaved(step=self.step, path=str(final), seconds=time.time() - t0)
        )
        return final

    @staticmethod
    def _prune_checkpoints(root: Path, keep: int) -> None:
        done = sorted(p for p in root.glob("step_*") if p.is_dir())
        for old in done[:-keep]:
            shutil.rmtree(old, ignore_errors=True)

    def _load_checkpoint(self) -> None:
        root = self.run_dir / CHECKPOINTS
        pointer = root / LATEST
        if not pointer.is_file():
            raise CheckpointError(
                f"--resume: no checkpoint in {root} (the run never reached checkpoint_every "
                f"steps); start it again without --resume"
            )
        ckpt = root / pointer.read_text().strip()
        state_file = ckpt / "orchestrator.json"
        if not state_file.is_file():
            raise CheckpointError(f"checkpoint {ckpt} is incomplete (no orchestrator.json)")
        state = json.loads(state_file.read_text())
        self.learner.load_checkpoint(ckpt / "learner")
        self.step = int(state["step"])
        self._saved_step = self.step
        self.cursor = DataCursor.from_dict(state["cursor"])
        self.buffer.load_state_dict(state["buffer"])
        self.buffer.learner_version = self.learner.version
        log.info("resumed from %s (step %d, version %d)", ckpt, self.step, self.learner.version)


def learner_worker(cfg: Config) -> str:
    """``orchestrator.learner_worker`` resolved: ``thread`` or ``process``."""
    worker = cfg.orchestrator.learner_worker
    if worker == "auto":
        return "process" if cfg.orchestrator.max_staleness > 0 else "thread"
    return worker


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    root = Path(run_dir) / CHECKPOINTS
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    return root / pointer.read_text().strip()


def _is_interrupt(e: BaseException) -> bool:
    if isinstance(e, KeyboardInterrupt):
        return True
    nested = getattr(e, "exceptions", None)  # BaseExceptionGroup (3.11+ or the backport)
    return bool(nested) and any(_is_interrupt(x) for x in nested)


def _seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


async def train(cfg: Config, run_dir: str | Path, resume: bool = False) -> Orchestrator:
    orch = Orchestrator(cfg, run_dir, resume=resume)
    await anyio.to_thread.run_sync(orch.build)
    await orch.run()
    return orch
