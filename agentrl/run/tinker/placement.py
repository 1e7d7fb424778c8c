"""Where the Tinker server's engine (the base model, adapters and optimizers) runs.

    server = open_server_from_config(cfg, state_dir, host, port)

The config places it the way it places a training run's learner, with the same keys:

* ``orchestrator.backend: local`` and ``learner.world_size: 1``: in the server's process on
  ``learner.device`` (``auto``: CUDA when present);
* ``orchestrator.backend: ray``: in a Ray actor with ``ray.learner``'s resources, pinned to
  the server's node (it writes the ``tinker://`` checkpoints under ``--state-dir``);
  ``learner.device`` is resolved there, on the actor's own node;
* ``learner.world_size: n`` (``learner.parallel: fsdp`` or ``ddp``): n ranks in one
  torch.distributed group (:mod:`.ranks`): child processes of the server, or Ray actors
  with ``orchestrator.backend: ray`` (:mod:`.ray_ranks`).

``sampler.backend: vllm`` samples through vLLM's multi-LoRA (:mod:`.vllm_lora`) instead of
peft's mixed-adapter batches (``hf``, the default).

The HTTP server holds a :class:`~agentrl.run.tinker.remote.RemoteEngine` for the last two;
the client code is the same for every placement.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.config import Config
from agentrl.errors import ConfigError
from agentrl.run.settings import sampler_settings, train_settings
from agentrl.run.tinker.engine import Engine
from agentrl.samplers.settings import SamplerSettings


@dataclass(frozen=True)
class EngineSettings:
    """What an engine needs: the base model, how it is loaded, and where."""

    base_model: str
    dtype: str | None  # None: the model's own (model.dtype: auto)
    device: str  # resolved learner.device
    backend: str = "local"  # orchestrator.backend
    world_size: int = 1  # learner.world_size
    parallel: str = "ddp"  # learner.parallel
    collective_timeout_s: float = 600.0
    sampler: SamplerSettings | None = None  # sampler.backend: vllm (None: peft's batches)


def engine_settings(cfg: Config) -> EngineSettings:
    """The engine's settings from a config (``learner.device`` resolved here: an error
    names the key)."""
    train = train_settings(cfg)
    backend = cfg.sampler.backend
    if backend == "openai":
        raise ConfigError(
            "agentrl serve --tinker: sampler.backend=openai cannot sample the trained "
            "adapters; use hf (peft, the default) or vllm (vLLM's multi-LoRA)"
        )
    if backend == "vllm" and train.world_size > 1:
        raise ConfigError(
            "agentrl serve --tinker: sampler.backend=vllm with learner.world_size="
            f"{train.world_size} is not supported; use learner.world_size=1 or sampler.backend=hf"
        )
    return EngineSettings(
        base_model=cfg.model.name,
        dtype=None if cfg.model.dtype == "auto" else cfg.model.dtype,
        device=train.device,
        backend=cfg.orchestrator.backend,
        world_size=train.world_size,
        parallel=train.parallel,
        collective_timeout_s=train.collective_timeout_s,
        sampler=sampler_settings(cfg) if backend == "vllm" else None,
    )


def load_engine(settings: EngineSettings, state_dir: Path) -> Engine:
    """The base model loaded on ``settings.device`` as an engine with no adapters yet."""
    from agentrl.models import load_model

    model, tokenizer = load_model(settings.base_model, settings.dtype, device=settings.device)
    engine = Engine(settings.base_model, model, tokenizer, state_dir, settings.device)
    if settings.sampler is not None:
        from agentrl.run.tinker.vllm_lora import VLLMLoraSampler

        engine.vllm = VLLMLoraSampler(settings.sampler, tokenizer.eos_token_id)
    return engine


def open_server_from_config(
    cfg: Config, state_dir: Path, host: str = "127.0.0.1", port: int = 0
) -> Any:
    """Start the Tinker server for `cfg`'s model, placed as the config says (above)."""
    from agentrl.run.tinker import serve_engine

    settings = engine_settings(cfg)
    state_dir = Path(state_dir)
    if settings.backend == "ray" and settings.world_size > 1:
        from agentrl.run.tinker.ray_ranks import start_ray_ranks

        engine: Any = start_ray_ranks(cfg, state_dir)
    elif settings.backend == "ray":
        from agentrl.run.tinker.remote import start_ray_engine

        engine = start_ray_engine(cfg, state_dir)
    elif settings.world_size > 1:
        from agentrl.run.tinker.ranks import start_rank_engine

        engine = start_rank_engine(settings, state_dir)
    else:
        engine = load_engine(settings, state_dir)
    try:
        return serve_engine(engine, state_dir, host, port)
    except BaseException:
        engine.close()
        raise
