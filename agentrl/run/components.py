"""The components of one run (:class:`Run`), each built from its resolved settings
(:mod:`agentrl.run.settings`): environment, sampler, rollout engine, reward pipeline, learner.

The run assembly (:mod:`agentrl.run.runtime`), the learner process and the Ray actor shells
(:mod:`agentrl.run.placement`) all build through here, so a config key means the same thing
wherever a component runs. Each sampler backend maps its settings to its own options
(``from_settings``, :mod:`agentrl.samplers`); a setting a backend cannot honour is an error
naming it, never silently dropped.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from agentrl.chat import ChatRenderer
from agentrl.config import Config
from agentrl.cpu_linear import route_linears
from agentrl.devices import check_memory, learner_bytes
from agentrl.envs import AgentProgram, AnyEnvironment, make_env
from agentrl.envs.dataset import attach_dataset
from agentrl.errors import ConfigError
from agentrl.learner import Learner
from agentrl.learner.lora import AdaptersOff, apply_lora
from agentrl.learner.settings import LearnerSettings
from agentrl.models import load_model
from agentrl.resources import ResourceScope
from agentrl.rewards import RewardPipeline
from agentrl.rewards.settings import RewardSettings
from agentrl.rollout import RolloutEngine
from agentrl.rollout.settings import RolloutSettings
from agentrl.run.settings import data_settings, gateway_settings, rollout_settings
from agentrl.samplers import Sampler, sampler_from_settings
from agentrl.samplers.settings import SamplerSettings

Role = Literal["train", "rollout", "eval"]


def build_env(cfg: Config, split: str = "train") -> AnyEnvironment:
    """The environment ``env`` names, with ``env.eval_options`` on top for ``eval``; with
    ``data.path`` its tasks come from that file (columns checked now, before any model
    loads)."""
    options = dict(cfg.env.options)
    if split == "eval":
        options.update(cfg.env.eval_options)
    env = make_env(cfg.env.name, **options)
    if cfg.data.path is not None:
        attach_dataset(env, data_settings(cfg), split)
    return env


def build_sampler(settings: SamplerSettings) -> Sampler:
    """The sampler `settings` ask for, built by its backend; ``hf`` loads its own model copy
    on ``sampler.device`` in ``model.dtype`` (the learner keeps float32 masters of its own)."""
    return sampler_from_settings(settings)


def episode_workflow(cfg: Config, env: AnyEnvironment) -> Any:
    """Who runs `env`'s episodes: None for ``rollout.workflow`` (the built-in episode runner
    unless set) for a step environment; an agent program runs behind the run's gateway."""
    if not isinstance(env, AgentProgram):
        return None
    from agentrl.gateway.workflow import agent_workflow  # the [gateway] extra (fastapi)

    return agent_workflow(env, gateway_settings(cfg, training=True), cfg.rollout.workflow)


def build_engine(
    cfg: Config,
    env: AnyEnvironment,
    sampler: Sampler,
    *,
    split: str = "train",
    group_size: int | None = None,
    rollout: RolloutSettings | None = None,
) -> RolloutEngine:
    """The rollout engine (renderer from the sampler's tokenizer and the env's tools);
    `rollout`: the run's resolved settings (default: resolved from `cfg` here)."""
    rollout = rollout or rollout_settings(cfg)
    if group_size is not None:  # evaluation: k plain samples per task, no branching
        branching = dataclasses.replace(rollout.branching, enabled=False)
        rollout = dataclasses.replace(rollout, group_size=group_size, branching=branching)
    renderer = ChatRenderer(
        sampler.tokenizer, tools=env.tool_schemas(), template=cfg.model.chat_template
    )
    return RolloutEngine(
        env,
        sampler,
        renderer,
        rollout,
        split=split,
        workflow=episode_workflow(cfg, env),
    )


def attach_rewards(
    rewards: RewardSettings, engine: Any, sampler: Any, scope: ResourceScope
) -> None:
    """``reward.functions`` / ``model`` / ``judge`` scoring the engine's episodes (see
    :mod:`agentrl.rewards`), closed with the run's scope."""
    if not rewards.enabled:
        return
    if engine.workflow is not None:
        raise ConfigError(
            "reward.functions / model / judge score the built-in episode runner's episodes; "
            f"a workflow ({engine.config.workflow!r}, or an agent program) returns its own "
            "reward: score inside it, or use rollout.workflow=episode"
        )
    pipeline = RewardPipeline.from_settings(rewards, sampler)
    engine.runner.rewards = pipeline
    scope.push(pipeline.aclose)


def load_learner(settings: LearnerSettings) -> Learner:
    """A :class:`~agentrl.learner.Learner` in this process, its kernels compiled (the thread
    learner, the learner process and the Ray learner actor all start here)."""
    device = torch.device(settings.train.device)
    model = settings.model
    policy, tokenizer = load_model(model.name, dtype="float32", seed=model.seed)
    if model.lora is not None:
        policy = apply_lora(policy, model.lora, model.gradient_checkpointing)
    if device.type == "cpu":  # compiled layers trace torch's own linear (learner.compile)
        route_linears(policy, "torch" if settings.train.compile == "on" else model.cpu_linear)
    n_params = sum(p.numel() for p in policy.parameters())
    n_trained = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    alg = settings.algorithm
    reference = bool(alg.kl) and alg.kl_coef > 0  # Objective.use_kl
    lora = model.lora is not None  # its reference is the policy with adapters off
    check_memory(
        settings.train.gpu_memory_fraction,
        "learner",
        learner_bytes(n_params, n_trained, reference=reference and not lora),
        device,
        f"float32 weights of {n_params / 1e6:.0f}M parameters, gradients and AdamW state of "
        f"{n_trained / 1e6:.0f}M{', a reference copy' if reference and not lora else ''}",
    )
    ref_model = None
    if lora and reference:  # the base weights, not a second copy
        ref_model = AdaptersOff(policy)
    learner = Learner(policy, tokenizer, settings, ref_model=ref_model)
    learner.warmup()
    return learner


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
