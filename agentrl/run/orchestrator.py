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

import logging
import time
from pathlib import Path
from typing import Any

import anyio

from agentrl.config import Config
from agentrl.rollout.curriculum import Curriculum
from agentrl.rollout.tasks import TaskCursor
from agentrl.run.buffer import Buffer
from agentrl.run.evaluation import Evaluator
from agentrl.run.events import (
    AdvantagesAssigned,
    BatchTrained,
    CheckpointSaved,
    EvalGroupsFinished,
    EventBus,
    GroupDropped,
    GroupFinished,
    RunFinished,
    RunStarted,
    WeightsPublished,
    summarize_group,
)
from agentrl.run.monitors import RunMonitor
from agentrl.run.preflight import check_run_config
from agentrl.run.process_settings import apply_process_settings
from agentrl.run.runtime import assemble
from agentrl.run.settings import monitor_settings
from agentrl.run.subscribers import subscribers_for
from agentrl.runfolder import CONFIG, has_checkpoint, load_run_checkpoint, save_run_checkpoint
from agentrl.types import TrajectoryGroup

log = logging.getLogger("agentrl.run.orchestrator")


class Orchestrator:
    """The training loop over the components :func:`agentrl.run.runtime.assemble` builds."""

    def __init__(self, cfg: Config, run_dir: str | Path, resume: bool = False) -> None:
        self.cfg = cfg
        # before any worker thread starts: threads that allocated already keep their arena
        apply_process_settings(cfg)
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.step = 0
        self.events = EventBus()
        # length drift across steps and monitors.alerts (agentrl.run.monitors)
        self.monitor = RunMonitor(monitor_settings(cfg), self.events)
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
        self._gate_waited = 0.0  # the sampler's wait for the learner's weight writes so far

    # --- construction ------------------------------------------------------------

    def build(self) -> None:
        """Assemble the run (learner, sampler, env, rollout), the buffer and the writers.

        Blocking (loads models): run it off the event loop."""
        cfg = self.cfg
        check_run_config(cfg, "train")  # every config problem at once, before the run folder
        started_before = (self.run_dir / CONFIG).is_file()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / CONFIG).write_text(cfg.to_yaml())
        self.parts = assemble(cfg, "train")
        try:
            self.env = self.parts.env
            self.sampler = self.parts.sampler
            self.learner = self.parts.learner
            self.weight_bus = self.parts.weight_bus
            self.rollout = self.parts.engine
            self.renderer = self.parts.renderer
            self.tokenizer = self.parts.tokenizer
            self.buffer = Buffer(
                max_staleness=cfg.orchestrator.max_staleness,
                dynamic_sampling=cfg.algorithm.dynamic_sampling,
                max_dropped=cfg.algorithm.max_dropped_groups,
                on_max_dropped=cfg.algorithm.on_max_dropped,
                min_reward_std=cfg.algorithm.min_group_reward_std,
                # never below the permits in flight, so put() only waits when the learner lags
                capacity=(cfg.orchestrator.max_staleness + 1) * cfg.learner.batch_groups,
                on_evict=self._evicted,
            )
            self.tasks = TaskCursor.for_env(self.env, cfg.orchestrator.seed)  # endless: epochs
            self.curriculum: Curriculum | None = None
            if cfg.orchestrator.curriculum != "off":  # learnability: by running success rate
                self.curriculum = Curriculum(
                    cfg.orchestrator.curriculum_min_weight, cfg.orchestrator.seed
                )
                self.tasks.keep = self.curriculum.keep
            self.evaluator = None
            if cfg.orchestrator.eval_every:  # held-out tasks through the training sampler
                self.evaluator = Evaluator.for_training(cfg, self.sampler)
            for writer in subscribers_for(cfg.logging, self.run_dir, cfg.orchestrator.max_steps):
                self.events.subscribe(writer)
            if self.resume:
                self._load_checkpoint(started_before)
        except BaseException:
            self.parts.learner.close()  # no learner process outlives a failed build
            raise

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
            async with self.parts:  # the run's scope: sampler, learner, sandboxes close on exit
                try:
                    # samplers start from the learner's weights: the same initial weights on a
                    # fresh run; restored ones after a resume
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
                            await self.save_checkpoint()
        except BaseException as e:
            if error is None:  # the run finished but closing one of its parts failed
                error = e
                # ... or a second Ctrl-C arrived while the first one's shutdown was closing
                # them: still the user's interrupt, not an error
                if not (self._stop_reason == "interrupted" and _is_interrupt(e)):
                    self._stop_reason = "error"
            raise
        finally:
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
            signum = await signals.__anext__()
        # said once the receiver is closed: from this line on, a second Ctrl-C interrupts
        # the shutdown itself (KeyboardInterrupt) instead of queueing behind the first
        log.warning(
            "received %s: finishing the current step and checkpointing",
            signal.Signals(signum).name,
        )
        self._stop_reason = "interrupted"
        scope.cancel()

    async def _producer(self) -> None:
        assert self._permits is not None
        async with anyio.create_task_group() as tg:
            while True:
                while self._wanted <= 0:  # enough groups for every remaining step
                    self._wanted_more = anyio.Event()
                    await self._wanted_more.wait()
                await self._permits.acquire()
                self._wanted -= 1  # only this loop takes from it, so it is still > 0 here
                tg.start_soon(self._run_group)

    async def _run_group(self) -> None:
        taken = self.tasks.take()  # in flight (re-issued after a resume) until buffered
        assert taken is not None  # the training stream is endless
        index, task = taken
        group = await self.rollout.run_task(task, index=index)
        if self.curriculum is not None:
            self.curriculum.observe(group)
        self._rollout_tokens += sum(t.num_model_tokens for t in group.trajectories)
        self._finished.append(summarize_group(group))
        self.events.publish(GroupFinished(group=group, step=self.step))
        admission = await self.buffer.put(group)
        # settled in the same event-loop turn as the buffer's append (no await between):
        # a snapshot sees it buffered or in flight. A cancelled or failed rollout stays in
        # flight, so a checkpoint after Ctrl-C re-issues its task instead of losing it
        self.tasks.settle(index)
        if not admission:
            self._dropped(group, admission.reason or "dropped")
            self._replace(1)

    def _evicted(self, groups: list[TrajectoryGroup]) -> None:
        """The buffer evicted admitted groups that went stale."""
        for group in groups:
            self._dropped(group, "dropped_stale_in_buffer")
        self._replace(len(groups))

    def _dropped(self, group: TrajectoryGroup, reason: str) -> None:
        index = int(group.metadata.get("task_index", -1))
        self.events.publish(
            GroupDropped(
                task_id=group.task_id, reason=reason, task_index=index, group_id=group.group_id
            )
        )

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
                    await self.save_checkpoint()
                return
            t_wait = time.time()
            groups = await self.buffer.get_batch(
                cfg.learner.batch_groups, learner_version=self.learner.version
            )
            # a step is atomic: once its groups left the buffer, it finishes (an interrupt
            # waits for it) so step counter, weights, version and checkpoint never disagree
            with anyio.CancelScope(shield=True):
                t0 = time.time()
                metrics = await self._train(groups)
                metrics["train_seconds"] = time.time() - t0
                metrics["learner_wait_seconds"] = t0 - t_wait
                self.step += 1
                await self._publish()
                await self.buffer.set_learner_version(self.learner.version)  # may evict
                for _ in groups:
                    self._permits.release()
                metrics.update(self._rollout_metrics(groups))
                credit = self.learner.last_credit
                if credit is not None:
                    self.events.publish(
                        AdvantagesAssigned(
                            step=self.step,
                            estimator=credit.estimator,
                            advantages=credit.advantages,
                        )
                    )
                if self._eval_due():
                    metrics.update(await self.evaluator.run())
                    held_out = self.evaluator.last_groups  # per task, for step N vs M
                    self.events.publish(EvalGroupsFinished(step=self.step, groups=held_out))
                self.monitor.observe(self.step, metrics)
                self.events.publish(
                    BatchTrained(
                        step=self.step,
                        version=self.learner.version,
                        metrics=metrics,
                        task_indices=[int(g.metadata.get("task_index", -1)) for g in groups],
                        group_ids=[g.group_id for g in groups],
                    )
                )
                every = cfg.orchestrator.checkpoint_every
                if (every and self.step % every == 0) or self.step == cfg.orchestrator.max_steps:
                    await self.save_checkpoint()

    def _eval_due(self) -> bool:
        every = self.cfg.orchestrator.eval_every
        last = self.step == self.cfg.orchestrator.max_steps
        return self.evaluator is not None and (self.step % every == 0 or last)

    async def _train(self, groups: list[TrajectoryGroup]) -> dict[str, float]:
        """One learner step, off the event loop."""
        return await anyio.to_thread.run_sync(self.learner.step, groups)

    async def _publish(self) -> None:
        t0 = time.time()
        # a learner in this process: the bus reads its live weights, no full copy (the
        # learner trains again only once publish has returned, every sampler swapped)
        weights = self.learner.sampler_weights()
        if weights is None:
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
        for k in dict.fromkeys(k for r in window for k in r):  # some only where they apply
            values = [r[k] for r in window if k in r]
            out[k] = sum(values) / len(values)
        out["groups_finished"] = float(len(window))
        trained = [summarize_group(g) for g in groups]
        if trained:
            for k in ("reward_mean", "success_rate"):
                out[f"batch/{k}"] = sum(r[k] for r in trained) / len(trained)
        elapsed = max(time.time() - self._rollout_t0, 1e-6)
        out["rollout_tokens_per_s"] = self._rollout_tokens / elapsed
        self._rollout_tokens = 0
        self._rollout_t0 = time.time()
        stats = self.sampler.stats()
        if "prefix_reused_tokens" in stats:  # the hf sampler's prefix reuse since the last step
            fed = stats["prefill_tokens"] - self._prefill_seen[0]
            reused = stats["prefix_reused_tokens"] - self._prefill_seen[1]
            out["sampler/prefix_reuse_frac"] = reused / max(fed + reused, 1)
            self._prefill_seen = (stats["prefill_tokens"], stats["prefix_reused_tokens"])
        if stats.get("weight_gate_wait_s"):  # computing on the learner's weights as they train
            waited = stats["weight_gate_wait_s"]
            out["sampler/weight_gate_wait_s"] = waited - self._gate_waited
            self._gate_waited = waited
        # a placement's own counters (ray: requests lost with a replica, weights missed)
        out.update({k: v for k, v in stats.items() if k.startswith("placement/")})
        out.update(self.buffer.metrics())
        if self.curriculum is not None:
            out.update(self.curriculum.metrics())
        return out

    # --- checkpoints ---------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The loop's state (step, version, task cursor, buffered groups) at this instant.

        Call it on the event loop: no rollout runs between its reads, so a group is either
        buffered or still in flight (re-issued on resume), never both or neither. The
        groups are deep copies (``to_dict``), so the write may happen elsewhere."""
        return {
            "step": self.step,
            "version": self.learner.version,
            "cursor": self.tasks.state_dict(),
            "buffer": self.buffer.state_dict(),
            **({"curriculum": self.curriculum.state_dict()} if self.curriculum else {}),
            "monitor": self.monitor.state_dict(),
        }

    async def save_checkpoint(self) -> Path:
        """Snapshot the loop on the event loop, then write it (and the learner's part, idle
        between steps) in a worker thread while the rollouts go on.

        Atomic: the checkpoint folder appears whole (or not at all), then `latest` moves.
        RNG states travel in the learner's part of the checkpoint."""
        t0 = time.time()
        state = self.snapshot()
        final = await anyio.to_thread.run_sync(
            save_run_checkpoint, self.run_dir, state["step"], state, self.learner.save_checkpoint
        )
        self._saved_step = state["step"]
        self.events.publish(
            CheckpointSaved(step=state["step"], path=str(final), seconds=time.time() - t0)
        )
        return final

    def _load_checkpoint(self, started_before: bool) -> None:
        if started_before and not has_checkpoint(self.run_dir):
            # killed before its first checkpoint: nothing was kept, so nothing can be lost
            log.warning(
                "--resume: %s has no checkpoint yet (the run stopped before its first one); "
                "starting it from step 0",
                self.run_dir,
            )
            return
        # the learner's part loads inside: an unreadable latest falls back to the previous
        ckpt, state = load_run_checkpoint(self.run_dir, self.learner.load_checkpoint)
        self.step = int(state["step"])
        self._saved_step = self.step
        self.tasks.load_state_dict(state["cursor"])
        if self.curriculum is not None:
            self.curriculum.load_state_dict(state.get("curriculum") or {})
        self.buffer.load_state_dict(state["buffer"])
        self.monitor.load_state_dict(state.get("monitor") or {})
        self.buffer.learner_version = self.learner.version
        log.info("resumed from %s (step %d, version %d)", ckpt, self.step, self.learner.version)


def _is_interrupt(e: BaseException) -> bool:
    if isinstance(e, KeyboardInterrupt):
        return True
    nested = getattr(e, "exceptions", None)  # BaseExceptionGroup (3.11+ or the backport)
    return bool(nested) and any(_is_interrupt(x) for x in nested)


async def train(cfg: Config, run_dir: str | Path, resume: bool = False) -> Orchestrator:
    orch = Orchestrator(cfg, run_dir, resume=resume)
    await anyio.to_thread.run_sync(orch.build)
    await orch.run()
    return orch
