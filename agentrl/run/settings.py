"""The resolve stage: the user's :class:`~agentrl.config.Config` turned, once, into frozen
settings per component.

    settings = resolve(cfg)                   # after validation, before anything is built
    Learner(model, tokenizer, settings.learner)
    sampler_from_settings(settings.sampler)
    RolloutEngine(env, sampler, renderer, settings.rollout)

Every ``auto`` that can be decided before a model loads, and every rule that spans
sections, is decided here: the learner's and the hf sampler's devices, the learner's
weight sharing, the hf sampler's dtype as the learner sees it, where the learner runs
(``orchestrator.learner_worker``), whether the run is asynchronous. Components below the
run layer take their own settings and never import :mod:`agentrl.config`. Every settings
object is a frozen dataclass that pickles (the learner process receives its own).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from pydantic import BaseModel

from agentrl.config import Config, RewardFunctionConfig, load_config
from agentrl.devices import Budget, check_budgets, resolve_device, sharing_kind
from agentrl.envs.dataset import DataSettings
from agentrl.errors import CheckpointError, ConfigError
from agentrl.learner.settings import (
    AlgorithmSettings,
    DistillSettings,
    LearnerSettings,
    LoraSettings,
    MonitorSettings,
    ObjectiveSettings,
    OverlongSettings,
    PolicyModelSettings,
    TeacherSettings,
    TrainSettings,
)
from agentrl.models import load_dtype
from agentrl.preference.settings import PreferenceSettings
from agentrl.rewards.settings import (
    RM_LR,
    JudgeSettings,
    RewardFunctionSettings,
    RewardModelTrainingSettings,
    RewardSettings,
)
from agentrl.rollout.settings import (
    BranchingSettings,
    GroupHookSettings,
    RolloutSettings,
    SamplingSettings,
)
from agentrl.samplers import on_update_policy
from agentrl.samplers.settings import SamplerSettings
from agentrl.training.settings import SFT_LR, SFTSettings, ToolSource

if TYPE_CHECKING:
    from agentrl.gateway.service import GatewaySettings

T = TypeVar("T")


def mirror(cls: type[T], section: BaseModel, **resolved: Any) -> T:
    """`cls` (a settings dataclass) from the config `section`'s fields of the same names;
    `resolved` replaces values decided here. Lists become tuples (frozen all the way)."""
    values: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name in resolved:
            values[f.name] = resolved[f.name]
        elif f.name in type(section).model_fields:
            value = getattr(section, f.name)
            values[f.name] = tuple(value) if isinstance(value, list) else value
    return cls(**values)


@dataclass(frozen=True)
class Settings:
    """One frozen settings object per component, and the run-wide decisions."""

    learner: LearnerSettings | None  # None for rollout and eval runs (no learner.device then)
    objective: ObjectiveSettings
    sampler: SamplerSettings
    rollout: RolloutSettings
    reward: RewardSettings
    asynchronous: bool  # orchestrator.max_staleness > 0
    learner_worker: str  # thread | process
    # each role placed by this run (the learner; the sampler on the hf backend): its device
    # and GPU memory budget (agentrl.devices.limit_process_memory)
    budgets: dict[str, Budget]

    def budgets_of(self, roles: list[str]) -> dict[str, Budget]:
        """The budgets of the `roles` one process runs."""
        return {role: self.budgets[role] for role in roles if role in self.budgets}


def is_asynchronous(cfg: Config) -> bool:
    """Sampler and learner compute at the same time (``orchestrator.max_staleness > 0``)."""
    return cfg.orchestrator.max_staleness > 0


def learner_worker(cfg: Config) -> str:
    """``orchestrator.learner_worker`` resolved: ``thread`` or ``process``."""
    worker = cfg.orchestrator.learner_worker
    if cfg.learner.world_size > 1:  # the ranks are processes the run layer launches
        if worker == "thread":
            raise ConfigError(
                f"learner.world_size={cfg.learner.world_size} runs the learner in "
                f"{cfg.learner.world_size} processes: set orchestrator.learner_worker=process "
                "(or auto), or learner.world_size=1"
            )
        return "process"
    if worker == "auto":
        return "process" if is_asynchronous(cfg) else "thread"
    return worker


def objective_settings(cfg: Config) -> ObjectiveSettings:
    """``algorithm`` with the keys the user set, and what the objective reads elsewhere."""
    alg = cfg.algorithm
    algorithm = mirror(
        AlgorithmSettings,
        alg,
        overlong=mirror(OverlongSettings, alg.overlong),
        options=dict(alg.options),
        explicit=frozenset(alg.model_fields_set),
    )
    return ObjectiveSettings(
        algorithm=algorithm,
        attribution=cfg.rollout.branching.attribution,
        norm_length=alg.norm_length or cfg.rollout.max_tokens,
        step_weight=cfg.reward.step_weight,
    )


def hf_sampler_dtype(sampler: SamplerSettings) -> torch.dtype | None:
    """The dtype the embedded ``hf`` sampler computes in (None for other backends, whose
    kernels are not the learner's whatever their dtype)."""
    if sampler.backend != "hf":
        return None
    dtype = None if sampler.model_dtype == "auto" else sampler.model_dtype
    if sampler.weight_precision in ("float32", "bfloat16"):
        dtype = sampler.weight_precision
    return load_dtype(sampler.model_name, dtype, sampler.device)


def learner_settings(
    cfg: Config,
    objective: ObjectiveSettings | None = None,
    sampler: SamplerSettings | None = None,
) -> LearnerSettings:
    """What the learner needs; resolves ``learner.device`` (an error names the key)."""
    return LearnerSettings(
        objective=objective or objective_settings(cfg),
        train=train_settings(cfg),
        model=policy_model_settings(cfg),
        temperature=cfg.sampler.temperature,
        total_steps=cfg.orchestrator.max_steps,
        seed=cfg.orchestrator.seed,
        max_staleness=cfg.orchestrator.max_staleness,
        sampler_backend=cfg.sampler.backend,
        sampler_dtype=hf_sampler_dtype(sampler or sampler_settings(cfg)),
        distill=distill_settings(cfg),
        monitors=monitor_settings(cfg),
        sampler_precision=cfg.sampler.weight_precision,
    )


def distill_settings(cfg: Config) -> DistillSettings:
    """``distill``: the teachers by key, the advantage's weights."""
    d = cfg.distill
    teachers = {k: mirror(TeacherSettings, t) for k, t in d.teachers.items()}
    teacher = mirror(TeacherSettings, d.teacher) if d.teacher is not None else None
    return mirror(DistillSettings, d, teacher=teacher, teachers=teachers)


def monitor_settings(cfg: Config) -> MonitorSettings:
    """``monitors``: the alerts as (metric, above | below, bound) rules."""
    m = cfg.monitors
    rules = tuple(
        (metric, side, float(bound))
        for metric, alert in m.alerts.items()
        for side, bound in (("above", alert.above), ("below", alert.below))
        if bound is not None
    )
    return mirror(MonitorSettings, m, alerts=rules)


def sampler_settings(cfg: Config) -> SamplerSettings:
    """The backend's settings: the hf sampler's device resolved (the others place
    themselves), ``sampler.on_update: auto`` as the backend's own policy."""
    s = cfg.sampler
    device = s.device
    if s.backend == "hf":
        device = str(resolve_device(s.device, "sampler.device"))
    explicit = {f"sampler.{k}" for k in s.model_fields_set}
    explicit |= {f"model.{k}" for k in cfg.model.model_fields_set}
    settings = mirror(
        SamplerSettings,
        s,
        device=device,
        options=dict(s.options),
        model_name=cfg.model.name,
        model_dtype=cfg.model.dtype,
        model_cpu_linear=cfg.model.cpu_linear,
        model_seed=cfg.model.seed,
        learner_device=cfg.learner.device,
        max_tokens=cfg.rollout.max_tokens,
        explicit=frozenset(explicit),
        share_learner_weights=s.share_learner_weights
        and s.backend == "hf"
        and cfg.orchestrator.backend == "local",
    )
    policy = on_update_policy(settings)
    share = settings.share_learner_weights
    if share and is_asynchronous(cfg) and policy != "keep":
        # weights that train under rows in flight are what on_update: keep means
        if "sampler.share_learner_weights" in explicit:
            raise ConfigError(
                f"sampler.share_learner_weights=true in an asynchronous run has the learner "
                f"change the weights while rows are in flight, which sampler.on_update="
                f"{policy} does not allow: set sampler.on_update=keep, or "
                "sampler.share_learner_weights=false"
            )
        share = False
    return dataclasses.replace(settings, on_update=policy, share_learner_weights=share)


def rollout_settings(cfg: Config) -> RolloutSettings:
    """``rollout``, the sampling parameters and the run's seed."""
    r = cfg.rollout
    hooks = tuple(
        h if isinstance(h, str) else GroupHookSettings(h.name, dict(h.options))
        for h in r.group_hooks
    )
    return mirror(
        RolloutSettings,
        r,
        branching=mirror(BranchingSettings, r.branching),
        group_hooks=hooks,
        sampling=mirror(SamplingSettings, cfg.sampler),
        seed=cfg.orchestrator.seed,
    )


def gateway_settings(cfg: Config, *, training: bool, **overrides: Any) -> GatewaySettings:
    """How a run's gateway serves: the ``gateway:`` section, the model's names and template,
    the sampling defaults; `overrides` win (``agentrl serve``'s flags); `training` locks the temperature (the learner recomputes log-probs at it)."""
    from agentrl.gateway.service import GatewaySettings  # the [gateway] extra (fastapi)

    s, g = cfg.sampler, cfg.gateway
    values: dict[str, Any] = dict(
        model_names=tuple(dict.fromkeys(("agentrl", cfg.model.name))),
        chat_template=cfg.model.chat_template,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        max_new_tokens=s.max_new_tokens,
        lock_temperature=training,
        max_n=g.max_n,
        strict_model=g.strict_model,
        tool_parser=g.tool_parser,
        subagent_credit=g.subagent_credit,
        host=g.host,
        port=g.port,
    )
    values.update(overrides)
    return GatewaySettings(**values)


def _function_settings(
    specs: list[Any], weights: list[float] | None = None
) -> tuple[RewardFunctionSettings, ...]:
    """Reward function entries with their weights (``reward.weights`` wins over ``weight``)."""
    out = []
    for i, spec in enumerate(specs):
        if isinstance(spec, str):
            spec = RewardFunctionConfig(fn=spec)
        weight = spec.weight if weights is None else weights[i]
        out.append(RewardFunctionSettings(spec.fn, weight, spec.name))
    return tuple(out)


def reward_settings(cfg: Config) -> RewardSettings:
    """``reward`` with the weights decided and ``reward.model_device`` resolved (only when a
    reward model is set)."""
    rc = cfg.reward
    device = rc.model_device
    if rc.model is not None or rc.process_model is not None:
        device = str(resolve_device(rc.model_device, "reward.model_device"))
    judge = None if rc.judge is None else mirror(JudgeSettings, rc.judge)
    return mirror(
        RewardSettings,
        rc,
        functions=_function_settings(rc.functions, rc.weights),
        process=_function_settings(rc.process),
        model_device=device,
        judge=judge,
    )


def placement_budgets(
    learner: LearnerSettings | None, sampler: SamplerSettings
) -> dict[str, Budget]:
    """The device and GPU memory share of each role this process places itself."""
    budgets: dict[str, Budget] = {}
    if learner is not None:
        budgets["learner"] = (torch.device(learner.train.device), learner.train.gpu_memory_fraction)
    if sampler.backend == "hf":  # vLLM and remote servers place themselves
        budgets["sampler"] = (torch.device(sampler.device), sampler.gpu_memory_fraction)
    return budgets


def check_placement(cfg: Config) -> None:
    """The devices and GPU memory shares of a training run add up (before anything loads)."""
    objective, sampler = objective_settings(cfg), sampler_settings(cfg)
    check_budgets(placement_budgets(learner_settings(cfg, objective, sampler), sampler))


def resolve(cfg: Config, role: str = "train") -> Settings:
    """Every component's settings for a `role` run (``train``, ``rollout``, ``eval``);
    only ``train`` resolves the learner's (an eval run does not check learner.device)."""
    objective = objective_settings(cfg)
    sampler = sampler_settings(cfg)
    learner = learner_settings(cfg, objective, sampler) if role == "train" else None
    budgets = placement_budgets(learner, sampler)
    check_budgets(budgets)
    return Settings(
        learner=learner,
        objective=objective,
        sampler=sampler,
        rollout=rollout_settings(cfg),
        reward=reward_settings(cfg),
        asynchronous=is_asynchronous(cfg),
        learner_worker=learner_worker(cfg) if role == "train" else "thread",
        budgets=budgets,
    )


# --- the training modes (agentrl dpo, sft, rm train) ----------------------------------------


def data_settings(cfg: Config) -> DataSettings:
    """``data`` as the dataset source reads it."""
    return mirror(DataSettings, cfg.data, answer_explicit="answer" in cfg.data.model_fields_set)


def train_settings(cfg: Config, **overrides: Any) -> TrainSettings:
    """``learner.*`` with ``learner.device`` resolved (an error names the key); `overrides`
    that are not None win (a mode's CLI flags, e.g. ``--device``, ``--lr``)."""
    lc = cfg.learner.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    device = resolve_device(lc.device, "learner.device")
    return mirror(
        TrainSettings,
        lc,
        device=str(device),
        weight_sharing=sharing_kind(lc.weight_sharing, device),
    )


def policy_model_settings(cfg: Config, name: str | None = None) -> PolicyModelSettings:
    """``model``: the policy a mode trains (`name` overrides ``model.name``)."""
    lora = cfg.model.lora
    return PolicyModelSettings(
        name=name or cfg.model.name,
        seed=cfg.model.seed,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        lora=None if lora is None else mirror(LoraSettings, lora),
        cpu_linear=cfg.model.cpu_linear,
    )


def tool_source(cfg: Config) -> ToolSource | None:
    """The config's environment, for rows without their own tools (only when it names one)."""
    if "name" not in cfg.env.model_fields_set:
        return None
    return ToolSource(cfg.env.name, dict(cfg.env.options))


def preference_settings(cfg: Config) -> PreferenceSettings:
    """``preference.*`` with the learner, policy and data settings ``agentrl dpo`` trains with."""
    pc = cfg.preference
    return mirror(
        PreferenceSettings,
        pc,
        options=dict(pc.options),
        train=train_settings(cfg),
        model=policy_model_settings(cfg),
        chat_template=cfg.model.chat_template,
        tools=tool_source(cfg),
        data=data_settings(cfg),
        config_yaml=cfg.to_yaml(),
    )


def preference_settings_of_run(run_dir: str | Path) -> PreferenceSettings:
    """The settings a preference run started with (its ``config.yaml``), for ``--resume``."""
    from agentrl.runfolder import CONFIG

    path = Path(run_dir) / CONFIG
    if not path.is_file():
        raise CheckpointError(f"--resume: {run_dir} has no {CONFIG} (not a dpo run)")
    return preference_settings(load_config(path))


def mode_lr(cfg: Config, lr: float | None, default: float) -> float:
    """A mode's learning rate: the flag, else ``learner.lr`` when the user set it, else the
    mode's own `default` (RL's 1e-6 is too small for SFT and reward models)."""
    if lr is not None:
        return lr
    return cfg.learner.lr if "lr" in cfg.learner.model_fields_set else default


def sft_settings(
    cfg: Config,
    *,
    model_name: str | None = None,
    lr: float | None = None,
    device: str | None = None,
    epochs: int = 1,
    batch_size: int = 8,
    max_length: int = 2048,
    eval_fraction: float = 0.0,
    seed: int = 0,
) -> SFTSettings:
    """``agentrl sft``: ``model.*`` and ``learner.*``, its flags overriding (`model_name`:
    ``model.name``, `lr`: ``learner.lr``, else SFT's 1e-5; `device`: ``learner.device``)."""
    return SFTSettings(
        model=policy_model_settings(cfg, model_name),
        train=train_settings(cfg, lr=mode_lr(cfg, lr, SFT_LR), device=device),
        chat_template=cfg.model.chat_template,
        tools=tool_source(cfg),
        epochs=epochs,
        batch_size=batch_size,
        max_length=max_length,
        eval_fraction=eval_fraction,
        seed=seed,
    )


def reward_model_training_settings(
    cfg: Config,
    *,
    model: str | None = None,
    lr: float | None = None,
    device: str | None = None,
    epochs: int = 1,
    batch_size: int = 8,
    eval_fraction: float = 0.1,
    max_length: int = 1024,
    seed: int = 0,
) -> RewardModelTrainingSettings:
    """``agentrl rm train``: the base model (`model`, else ``model.name``) and ``learner.*``,
    its flags overriding (`lr`: ``learner.lr``, else 5e-5; `device`: ``learner.device``)."""
    return RewardModelTrainingSettings(
        model=model or cfg.model.name,
        train=train_settings(cfg, lr=mode_lr(cfg, lr, RM_LR), device=device),
        epochs=epochs,
        batch_size=batch_size,
        eval_fraction=eval_fraction,
        max_length=max_length,
        seed=seed,
    )
