"""One run assembly: every component of a run built from its config, for each role.

    run = assemble(cfg, "train")        # blocking (loads models): call it off the event loop
    async with run:                     # the run's resource scope is active inside
        ...                             # run.sampler, run.engine, run.learner, run.weight_bus
                                        # leaving closes sampler, learner, sandboxes, ...

Roles: ``train`` (environment, sampler, learner in a thread or its own process, weight
bus, rollout engine), ``rollout`` and ``eval`` (environment, sampler, engine; ``eval``
uses ``env.eval_options`` and loads a checkpoint's weights into the sampler whatever its
backend). Every entry point goes through here; this is where a run chooses between this
process and Ray (``orchestrator.backend``) and between a thread learner and a learner
process. The components themselves are built by :mod:`agentrl.run.components`, the same way
in every placement.

Everything a run opens is registered in one :class:`~agentrl.resources.ResourceScope`;
``async with run`` makes it the run scope for tools (the python tool's sandbox lives
there) and closes it, in reverse order, on every exit path.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anyio

from agentrl.config import Config
from agentrl.devices import limit_process_memory
from agentrl.errors import ConfigError
from agentrl.learner import Learner
from agentrl.learner.objective import check_algorithm
from agentrl.models import prepare_files
from agentrl.resources import ResourceScope
from agentrl.rewards import RewardPipeline
from agentrl.run.components import (
    Role,
    Run,
    attach_rewards,
    build_engine,
    build_env,
    build_sampler,
    load_learner,
)
from agentrl.run.placement.assemble import assemble_on_ray
from agentrl.run.placement.learner_process import LearnerProcess, drill_fault
from agentrl.run.settings import Settings, resolve
from agentrl.runfolder import policy_weights_file, resolve_checkpoint
from agentrl.weights import WeightBus

log = logging.getLogger(__name__)


def start_learner(cfg: Config, settings: Settings) -> Learner | LearnerProcess:
    """The learner `orchestrator.learner_worker` asks for: here, or in its own process
    (started now; it loads its model while the caller builds the rest)."""
    assert settings.learner is not None  # a train run's
    if settings.learner_worker == "thread":
        return load_learner(settings.learner)
    # a conversion the model needs (first run of the embedded default) happens once, here
    prepare_files(cfg.model.name)
    return LearnerProcess(cfg, settings.learner, fault=drill_fault())


def assemble(cfg: Config, role: Role, *, split: str | None = None, samples: int = 1) -> Run:
    """Build every component `role` needs from `cfg` (blocking: loads models).

    `split` picks the environment's task split (default: train; eval for ``eval``);
    `samples` is the group size of an ``eval`` run. On failure, whatever was started
    (a learner process) is stopped before the error propagates.
    ``orchestrator.backend: ray`` builds the same parts in Ray actors (agentrl.run.placement)."""
    if cfg.orchestrator.backend == "ray":
        if cfg.reward.enabled:
            raise ConfigError(
                "reward.functions / model / judge run in the local backend's episodes only: "
                "set orchestrator.backend=local"
            )
        if role == "train":
            return assemble_on_ray(cfg, role, split=split, samples=samples)
        # rollout and eval are one process whatever the training placement
        log.info("agentrl %s runs in this process (orchestrator.backend=ray places training)", role)
        cfg = cfg.model_copy(deep=True)
        cfg.orchestrator.backend = "local"
    scope = ResourceScope("run")
    learner = None
    try:
        # every auto and cross-section rule, once: a device this machine lacks fails here,
        # before anything starts
        settings = resolve(cfg, role)
        here = ["sampler"] + (["learner"] if settings.learner_worker == "thread" else [])
        limit_process_memory(settings.budgets_of(here))
        split = split or ("eval" if role == "eval" else "train")
        env = build_env(cfg, split)
        if settings.reward.enabled:  # bad reward settings fail here, before any model loads
            RewardPipeline.check(settings.reward)
        if role == "train":  # registry names and algorithm.options, before any model loads
            check_algorithm(settings.objective)
        if role == "train":  # a learner process loads its model while this one builds the rest
            learner = start_learner(cfg, settings)
        sampler = build_sampler(settings.sampler)
        scope.push(sampler.close)
        if learner is not None:
            scope.push(lambda: anyio.to_thread.run_sync(learner.close))
        engine = build_engine(
            cfg,
            env,
            sampler,
            split=split,
            group_size=samples if role == "eval" else None,
            rollout=settings.rollout,
        )
        attach_rewards(settings.reward, engine, sampler, scope)
        run = Run(cfg=cfg, role=role, env=env, sampler=sampler, engine=engine, scope=scope)
        if learner is not None:
            learner.wait_ready()  # a learner that cannot start fails the assembly, not the run
            share_learner_weights(settings, sampler, learner)
            run.learner = learner
            run.weight_bus = WeightBus()
            run.weight_bus.register(sampler)
        return run
    except BaseException:
        if learner is not None:
            learner.close()
        raise


def share_learner_weights(
    settings: Settings, sampler: Any, learner: Learner | LearnerProcess
) -> None:
    """The hf sampler computes on the learner's weights (no second copy;
    ``sampler.share_learner_weights``): its live tensors in this process, or the shared
    buffers a learner process trains in. In an asynchronous run the two take turns on them
    through the learner's weight gate (:mod:`agentrl.weights.gate`); without one (LoRA,
    FSDP, CUDA IPC) the sampler keeps its copy."""
    share = getattr(sampler, "share_weights_from", None)
    if not settings.sampler.share_learner_weights or share is None:
        return
    gate = learner.weight_gate() if settings.asynchronous else None
    if settings.asynchronous and gate is None:
        log.info("the sampler keeps its own copy of the weights (the learner's are not shared)")
        return
    weights = learner.sampler_weights()
    if weights is None:  # a learner process: its shared buffers
        weights = learner.state_dict_for_sampler()
    saved = share(weights, gate)
    if saved:
        log.info(
            "the sampler computes on the learner's weights (%.0f MB not copied%s)",
            saved / 2**20,
            "; they take turns on them" if gate is not None else "",
        )


async def load_checkpoint_into_sampler(run: Run, checkpoint: str | Path) -> int:
    """Give the sampler the policy weights of `checkpoint` (a run or checkpoint folder),
    through the same update path as training, whatever the backend; returns the version."""
    ckpt = resolve_checkpoint(checkpoint)
    weights, version = policy_weights_file(ckpt)
    if version > run.sampler.version:
        await run.sampler.update_weights(str(weights), version)
    return version
