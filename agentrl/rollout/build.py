"""Build a rollout engine (environment, sampler, renderer) from a run config."""

from __future__ import annotations

from typing import Any

from agentrl.rollout.engine import RolloutEngine


def build_engine(cfg: Any, *, split: str = "train") -> RolloutEngine:
    """A :class:`RolloutEngine` for `cfg` (an :class:`agentrl.config.Config`).

    The caller owns the sampler: ``await engine.sampler.close()`` when done.
    """
    from agentrl.chat import ChatRenderer
    from agentrl.envs import make_env
    from agentrl.models import load_model
    from agentrl.samplers import create_sampler

    env = make_env(cfg.env.name, **cfg.env.options)
    dtype = None if cfg.model.dtype == "auto" else cfg.model.dtype
    if cfg.sampler.backend == "hf":
        model, tokenizer = load_model(cfg.model.name, dtype=dtype)
        sampler = create_sampler(
            "hf",
            model=(model, tokenizer),
            max_batch_size=cfg.sampler.max_batch_size,
            drain_on_update=cfg.sampler.drain_on_update,
            **cfg.sampler.options,
        )
    else:
        options = dict(cfg.sampler.options)
        if cfg.sampler.base_url:
            options["base_url"] = cfg.sampler.base_url
        if cfg.sampler.api_key:
            options["api_key"] = cfg.sampler.api_key
        sampler = create_sampler(cfg.sampler.backend, model=cfg.model.name, **options)
        tokenizer = sampler.tokenizer
    renderer = ChatRenderer(tokenizer, tools=env.tool_schemas(), template=cfg.model.chat_template)
    return RolloutEngine(
        env,
        sampler,
        renderer,
        cfg.rollout,
        sampler_cfg=cfg.sampler,
        seed=cfg.orchestrator.seed,
        split=split,
    )
