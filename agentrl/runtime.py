"""One run assembly: every component of a run built from its config, for each role.

    run = assemble(cfg, "train")        # blocking (loads models): call it off the event loop
    async with run:                     # the run's resource scope is active inside
        ...                             # run.sampler, run.engine, run.learner, run.weight_bus
                                        # leaving closes sampler, learner, sandboxes, ...

Roles: ``train`` (environment, sampler, learner in a thread or its own process, weight
bus, rollout engine), ``rollout`` and ``eval`` (environment, sampler, engine; ``eval``
uses ``env.eval_options`` and loads a checkpoint's weights into the sampler whatever its
backend), and the learner child (:func:`load_learner`, which the thread learner uses too).
Every entry point goes through here, so a config key means the same thing everywhere:
sampler settings are forwarded to the backends that can honour them, and a setting a
backend cannot honour is an error naming it, never silently dropped.

Everything a run opens is registered in one :class:`~agentrl.resources.ResourceScope`;
``async with run`` makes it the run scope for tools (the python tool's sandbox lives
there) and closes it, in reverse order, on every exit path.
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio

from agentrl.config import Config
from agentrl.errors import ConfigError
from agentrl.resources import ResourceScope

log = logging.getLogger(__name__)

Role = Literal["train", "rollout", "eval"]


# --- process settings ---------------------------------------------------------------------


def learner_worker(cfg: Config) -> str:
    """``orchestrator.learner_worker`` resolved: ``thread`` or ``process``."""
    worker = cfg.orchestrator.learner_worker
    if worker == "auto":
        return "process" if cfg.orchestrator.max_staleness > 0 else "thread"
    return worker


def is_asynchronous(cfg: Config) -> bool:
    return cfg.orchestrator.max_staleness > 0


def apply_process_settings(cfg: Config) -> None:
    """Allocator, torch threads and seeds for a process that runs part of `cfg`.

    Call first thing: threads that allocated before keep their own malloc arena."""
    import numpy as np
    import torch

    from agentrl.cpu import set_allocator, set_threads

    set_allocator(cfg.orchestrator.cpu_allocator)
    set_threads(cfg.orchestrator.cpu_threads, asynchronous=is_asynchronous(cfg))
    seed = cfg.orchestrator.seed
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(name: str, key: str = "sampler.device") -> str:
    """``auto`` = CUDA when present, else CPU; a device this machine lacks is a
    :class:`ConfigError` naming `key` (see :mod:`agentrl.devices`)."""
    from agentrl.devices import resolve_device as resolve

    return str(resolve(name, key))


# --- components -----------------------------------------------------------------------------


def build_env(cfg: Config, split: str = "train") -> Any:
    from agentrl.envs import make_env

    options = dict(cfg.env.options)
    if split == "eval":
        options.update(cfg.env.eval_options)
    env = make_env(cfg.env.name, **options)
    if cfg.data.path is not None:  # the tasks come from data.path (agentrl.envs.dataset)
        from agentrl.envs.dataset import attach_dataset

        attach_dataset(env, cfg.data, split)  # columns checked now, before any model loads
    return env


def _user_set(section: Any, key: str) -> bool:
    return key in section.model_fields_set


# what each backend does with in-flight sequences on a weight update when nothing says
_ON_UPDATE_DEFAULT = {"hf": "keep", "vllm": "reprefill", "openai": "drain"}
# the policies a backend can honour, and why not the others
_ON_UPDATE_CANNOT = {
    ("vllm", "keep"): "vLLM preempts running sequences on a weight swap and recomputes their "
    "KV on the new weights (reset_prefix_cache(reset_running_requests=True)), so use "
    "reprefill (what it does) or drain",
    ("openai", "keep"): "the openai backend finishes in-flight requests before a weight "
    "reload, so use drain",
    ("openai", "reprefill"): "the openai backend finishes in-flight requests before a weight "
    "reload, so use drain",
}


def on_update_policy(cfg: Config) -> str:
    """``sampler.on_update`` resolved to ``keep``, ``reprefill`` or ``drain`` for the run's
    backend; a contradiction with ``sampler.drain_on_update`` or
    ``orchestrator.partial_rollouts``, or a policy the backend cannot honour, is a
    :class:`ConfigError` naming the keys."""
    s, backend = cfg.sampler, cfg.sampler.backend
    drains = [
        key
        for key, on in (
            ("sampler.drain_on_update=true", s.drain_on_update),
            ("orchestrator.partial_rollouts=false", not cfg.orchestrator.partial_rollouts),
        )
        if on
    ]
    if s.on_update in ("keep", "reprefill") and drains:
        raise ConfigError(
            f"sampler.on_update={s.on_update} contradicts {drains[0]} (which finishes in-flight "
            f"sequences on the old weights): remove {drains[0].split('=')[0]}, or set "
            "sampler.on_update=drain"
        )
    if s.on_update != "auto":
        policy = s.on_update
    else:
        policy = "drain" if drains else _ON_UPDATE_DEFAULT[backend]
    why = _ON_UPDATE_CANNOT.get((backend, policy))
    if why:
        raise ConfigError(
            f"sampler.on_update={policy} cannot be honoured by sampler.backend={backend}: {why}"
        )
    return policy


def sampler_options(cfg: Config) -> dict[str, Any]:
    """The keyword options `cfg` gives its sampler backend.

    First-class settings (``sampler.max_batch_size``, ``on_update``, ``drain_on_update``,
    ``device``, ``model.dtype``, ``orchestrator.partial_rollouts``) are forwarded where the
    backend honours them; one a backend cannot honour, set by the user, is a
    :class:`ConfigError`. ``sampler.options`` holds backend-specific extras and may not
    repeat those."""
    s, backend = cfg.sampler, cfg.sampler.backend
    first_class = {"max_batch_size", "on_update", "drain_on_update", "device", "dtype"}
    doubled = sorted(first_class & set(s.options))
    if doubled:
        raise ConfigError(
            f"sampler.options.{doubled[0]} repeats a first-class setting: set "
            + ("model.dtype" if doubled[0] == "dtype" else f"sampler.{doubled[0]}")
            + " instead"
        )
    remote = [key for key in ("base_url", "api_key") if getattr(s, key)]
    if backend != "openai" and remote:
        raise ConfigError(
            f"sampler.{remote[0]} is for sampler.backend=openai (this run uses {backend}); "
            "remove it or set sampler.backend=openai"
        )
    options = dict(s.options)
    # partial rollouts off = finish in-flight sequences on the old weights before a swap
    policy = on_update_policy(cfg)
    drain = policy == "drain"
    dtype = cfg.model.dtype
    if backend == "hf":
        options.update(max_batch_size=s.max_batch_size, on_update=policy)
        return options
    if backend == "vllm":
        if _user_set(s, "device") and s.device != "auto":
            raise ConfigError(
                f"sampler.device={s.device!r}: the vllm backend places itself (CUDA when the "
                "vllm build has it); choose GPUs with CUDA_VISIBLE_DEVICES and leave "
                "sampler.device at auto"
            )
        options.update(max_batch_size=s.max_batch_size, drain_on_update=drain, dtype=dtype)
        return options
    # openai: a server elsewhere decides its own placement, precision and batching
    rejected = {
        "model.dtype": _user_set(cfg.model, "dtype") and dtype != "auto",
        "sampler.device": _user_set(s, "device") and s.device != "auto",
        "orchestrator.partial_rollouts": _user_set(cfg.orchestrator, "partial_rollouts")
        and cfg.orchestrator.partial_rollouts,
    }
    bad = [k for k, v in rejected.items() if v]
    if bad:
        why = {
            "model.dtype": "the server's precision is set where it starts (vllm serve --dtype)",
            "sampler.device": "the server places itself",
            "orchestrator.partial_rollouts": "the openai backend finishes in-flight requests "
            "before a weight reload, so rollouts never span two versions",
        }[bad[0]]
        raise ConfigError(
            f"{bad[0]} cannot be honoured by sampler.backend=openai: {why}; remove it or "
            "use sampler.backend=hf or vllm"
        )
    if _user_set(s, "max_batch_size"):
        options["max_concurrency"] = s.max_batch_size  # requests in flight to the server
    if s.base_url:
        options["base_url"] = s.base_url
    if s.api_key:
        options["api_key"] = s.api_key
    return options


def build_sampler(cfg: Config) -> Any:
    """The sampler `cfg` asks for; ``hf`` loads its own model copy on ``sampler.device`` in
    ``model.dtype`` (the learner keeps float32 masters of its own)."""
    from agentrl.models import load_model, load_tokenizer
    from agentrl.samplers import create_sampler

    options = sampler_options(cfg)
    backend = cfg.sampler.backend
    if backend == "hf":
        from agentrl.devices import check_memory, sampler_bytes
        from agentrl.devices import resolve_device as resolve

        device = resolve(cfg.sampler.device, "sampler.device")
        hf_model = load_model(
            cfg.model.name,
            dtype=None if cfg.model.dtype == "auto" else cfg.model.dtype,
            device=device,
            seed=cfg.model.seed,
        )
        need, what = sampler_bytes(hf_model[0], cfg.sampler.max_batch_size, cfg.rollout.max_tokens)
        check_memory(cfg, "sampler", need, device, what)
        return create_sampler("hf", model=hf_model, **options)
    if backend == "openai":
        options.setdefault("tokenizer", load_tokenizer(cfg.model.name))
    return create_sampler(backend, model=cfg.model.name, **options)


def build_engine(
    cfg: Config, env: Any, sampler: Any, *, split: str = "train", group_size: int | None = None
) -> Any:
    """The rollout engine (renderer from the sampler's tokenizer and the env's tools)."""
    from agentrl.chat import ChatRenderer
    from agentrl.rollout import RolloutEngine

    rollout_cfg = cfg.rollout
    if group_size is not None:  # evaluation: k plain samples per task, no branching
        rollout_cfg = rollout_cfg.model_copy(update={"group_size": group_size})
        rollout_cfg.branching = rollout_cfg.branching.model_copy(update={"enabled": False})
    renderer = ChatRenderer(
        sampler.tokenizer, tools=env.tool_schemas(), template=cfg.model.chat_template
    )
    return RolloutEngine(
        env,
        sampler,
        renderer,
        rollout_cfg,
        sampler_cfg=cfg.sampler,
        seed=cfg.orchestrator.seed,
        split=split,
        workflow=env.episode_workflow(cfg),  # an agent program's own, say; else rollout.workflow
    )


def attach_rewards(cfg: Config, engine: Any, sampler: Any, scope: ResourceScope) -> None:
    """``reward.functions`` / ``model`` / ``judge`` scoring the engine's episodes (see
    :mod:`agentrl.rewards`), closed with the run's scope."""
    if not cfg.reward.enabled:
        return
    if engine.workflow is not None:
        raise ConfigError(
            "reward.functions / model / judge score the built-in episode runner's episodes; "
            f"a workflow ({cfg.rollout.workflow!r}, or an agent program) returns its own "
            "reward: score inside it, or use rollout.workflow=episode"
        )
    from agentrl.rewards import RewardPipeline

    pipeline = RewardPipeline.from_config(cfg, sampler)
    engine.runner.rewards = pipeline
    scope.push(pipeline.aclose)


def load_learner(cfg: Config) -> Any:
    """A :class:`~agentrl.learner.Learner` in this process, its kernels compiled (the thread
    learner and the learner child both start here)."""
    from agentrl.devices import check_memory, learner_bytes
    from agentrl.devices import resolve_device as resolve
    from agentrl.learner import Learner
    from agentrl.models import load_model

    device = resolve(cfg.learner.device, "learner.device")
    policy, tokenizer = load_model(cfg.model.name, dtype="float32", seed=cfg.model.seed)
    if cfg.model.lora is not None:
        from agentrl.learner.lora import apply_lora

        policy = apply_lora(policy, cfg.model.lora, cfg.model.gradient_checkpointing)
    n_params = sum(p.numel() for p in policy.parameters())
    n_trained = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    reference = bool(cfg.algorithm.kl) and cfg.algorithm.kl_coef > 0  # Objective.use_kl
    lora = cfg.model.lora is not None  # its reference is the policy with adapters off
    check_memory(
        cfg,
        "learner",
        learner_bytes(n_params, n_trained, reference=reference and not lora),
        device,
        f"float32 weights of {n_params / 1e6:.0f}M parameters, gradients and AdamW state of "
        f"{n_trained / 1e6:.0f}M{', a reference copy' if reference and not lora else ''}",
    )
    ref_model = None
    if cfg.model.lora is not None and reference:  # the base weights, not a second copy
        from agentrl.learner.lora import AdaptersOff

        ref_model = AdaptersOff(policy)
    learner = Learner(policy, tokenizer, cfg, ref_model=ref_model)
    learner.warmup()
    return learner


def start_learner(cfg: Config) -> Any:
    """The learner `orchestrator.learner_worker` asks for: here, or in its own process
    (started now; it loads its model while the caller builds the rest)."""
    if learner_worker(cfg) == "thread":
        return load_learner(cfg)
    from agentrl.learner.worker import LearnerProcess
    from agentrl.models import prepare_files

    # a conversion the model needs (first run of the embedded default) happens once, here
    prepare_files(cfg.model.name)
    return LearnerProcess(cfg)


# --- the assembly ---------------------------------------------------------------------------


@dataclass
class Run:
    """The components of one run, owned by one resource scope."""

    cfg: Config
    role: Role
    env: Any
    sampler: Any
    engine: Any
    scope: ResourceScope = field(default_factory=lambda: ResourceScope("run"))
    learner: Any = None
    weight_bus: Any = None
    # held by the learner's step when the sampler computes on the learner's own weights
    # (share_learner_weights); None when the sampler has a copy
    weight_guard: threading.Lock | None = None
    _activation: Any = None

    @property
    def renderer(self) -> Any:
        return self.engine.runner.renderer

    @property
    def tokenizer(self) -> Any:
        return self.sampler.tokenizer

    async def __aenter__(self) -> Run:
        self._activation = self.scope.active()
        self._activation.__enter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.scope.aclose()
        finally:
            self._activation.__exit__(None, None, None)


def assemble(cfg: Config, role: Role, *, split: str | None = None, samples: int = 1) -> Run:
    """Build every component `role` needs from `cfg` (blocking: loads models).

    `split` picks the environment's task split (default: train; eval for ``eval``);
    `samples` is the group size of an ``eval`` run. On failure, whatever was started
    (a learner process) is stopped before the error propagates.
    ``orchestrator.backend: ray`` builds the same parts in Ray actors (agentrl.placement)."""
    if cfg.orchestrator.backend == "ray":
        if cfg.reward.enabled:
            raise ConfigError(
                "reward.functions / model / judge run in the local backend's episodes only: "
                "set orchestrator.backend=local"
            )
        from agentrl.placement import assemble_on_ray

        return assemble_on_ray(cfg, role, split=split, samples=samples)
    from agentrl.devices import check_placement, limit_process_memory

    scope = ResourceScope("run")
    learner = None
    try:
        if role == "train":  # a device this machine lacks fails here, before anything starts
            check_placement(cfg)
            here = ["sampler"] + (["learner"] if learner_worker(cfg) == "thread" else [])
        else:
            here = ["sampler"]
        limit_process_memory(cfg, here)
        split = split or ("eval" if role == "eval" else "train")
        env = build_env(cfg, split)
        if cfg.reward.enabled:  # bad reward settings fail here, before any model loads
            from agentrl.rewards import RewardPipeline

            RewardPipeline.check(cfg)
        if role == "train":  # a learner process loads its model while this one builds the rest
            learner = start_learner(cfg)
        sampler = build_sampler(cfg)
        scope.push(sampler.close)
        if learner is not None:
            scope.push(lambda: anyio.to_thread.run_sync(learner.close))
        engine = build_engine(
            cfg, env, sampler, split=split, group_size=samples if role == "eval" else None
        )
        attach_rewards(cfg, engine, sampler, scope)
        run = Run(cfg=cfg, role=role, env=env, sampler=sampler, engine=engine, scope=scope)
        if learner is not None:
            from agentrl.weights import WeightBus

            learner.wait_ready()  # a learner that cannot start fails the assembly, not the run
            run.learner = learner
            run.weight_bus = WeightBus()
            run.weight_bus.register(sampler)
            run.weight_guard = share_learner_weights(cfg, learner, sampler)
        return run
    except BaseException:
        if learner is not None:
            learner.close()
        raise


def sharing_blockers(cfg: Config, learner: Any, sampler: Any) -> list[str]:
    """Why the sampler keeps its own copy of the weights (empty: it may compute on the
    learner's, see :func:`share_learner_weights`)."""
    from agentrl.learner import Learner

    out = []
    if cfg.learner.share_weights == "off":
        out.append("learner.share_weights=off")
    staleness = cfg.orchestrator.max_staleness
    if isinstance(learner, Learner):
        if staleness != 0:
            # the sampler generates while this process's learner steps: its lock would be
            # held for the whole step
            out.append(
                f"orchestrator.max_staleness={staleness} with the learner in this process "
                "(orchestrator.learner_worker=thread)"
            )
    else:
        live = getattr(learner, "live_weights", None)
        if not callable(live) or live() is None:
            out.append("the learner process keeps its weights apart (on CUDA, or with LoRA)")
        updates = cfg.learner.ppo_epochs * cfg.learner.minibatches
        if staleness != 0 and updates != 1:
            out.append(
                f"{updates} optimizer updates per step (learner.ppo_epochs x "
                "learner.minibatches): the sampler would generate on weights between versions"
            )
    if not callable(getattr(sampler, "share_weights", None)):
        out.append(f"sampler.backend={cfg.sampler.backend}")
    if cfg.model.lora is not None:
        out.append("model.lora (the sampler loads merged weights)")
    return out


def share_learner_weights(cfg: Config, learner: Any, sampler: Any) -> threading.Lock | None:
    """Let the hf sampler compute on the learner's own weight tensors instead of a copy of
    its own, which is freed; a publish then copies nothing.

    * The learner in this process (a synchronous run, same device and dtype): returns the
      lock the orchestrator holds around each learner step.
    * A learner process whose parameters live in shared memory (synchronous or not, one
      optimizer update per step when not): the sampler computes on the mapped buffers under
      the process's :class:`~agentrl.weights.lock.WeightLock`, which the learner takes
      only around its optimizer step; returns None (the orchestrator holds nothing).

    None as well when the sampler keeps its copy (why is logged)."""
    from agentrl.cpu import release_freed_memory
    from agentrl.learner import Learner

    blockers = sharing_blockers(cfg, learner, sampler)
    guard: threading.Lock | None = None
    if not blockers:
        try:
            if isinstance(learner, Learner):
                guard = threading.Lock()
                sampler.share_weights(learner.sampler_weights(), guard)
            else:
                weights, lock = learner.live_weights()
                sampler.share_weights(weights, lock)
        except ValueError as e:  # another dtype or device (say model.dtype float16)
            blockers.append(str(e))
            guard = None
    if blockers:
        if cfg.learner.share_weights == "on":
            raise ConfigError(
                "learner.share_weights=on, but the sampler cannot compute on the learner's "
                f"weights: {'; '.join(blockers)}. Set learner.share_weights=auto to keep a copy"
            )
        log.info("the sampler keeps its own weights: %s", "; ".join(blockers))
        return None
    release_freed_memory()  # the sampler's own copy: not kept resident by the allocator
    log.info(
        "the sampler computes on the learner's weights (learner.share_weights), in %s",
        getattr(sampler, "computes_in", "their dtype"),
    )
    return guard


async def load_checkpoint_into_sampler(run: Run, checkpoint: str | Path) -> int:
    """Give the sampler the policy weights of `checkpoint` (a run or checkpoint folder),
    through the same update path as training, whatever the backend; returns the version."""
    from agentrl.checkpoint_files import policy_weights_file, resolve_checkpoint

    ckpt = resolve_checkpoint(checkpoint)
    weights, version = policy_weights_file(ckpt)
    if version > run.sampler.version:
        await run.sampler.update_weights(str(weights), version)
    return version
