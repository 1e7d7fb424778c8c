"""What the learner needs of a run, resolved once by the run layer (:mod:`agentrl.run.settings`).

    settings = resolve(cfg).learner            # LearnerSettings, frozen and picklable
    learner = Learner(model, tokenizer, settings)

Field names follow the config keys they come from (``algorithm.*``, ``learner.*``), so an
error can name the key; every ``auto`` that can be decided before a model loads already is
(the learner's device, the sampler's dtype, the world of ranks).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class OverlongSettings:
    """``algorithm.overlong``: DAPO's soft overlong penalty and filter."""

    enabled: bool = False
    max_len: int = 1024
    cache_len: int = 256
    coef: float = 1.0
    filter: bool = False


@dataclass(frozen=True)
class AlgorithmSettings:
    """``algorithm``: advantage estimator, policy loss, corrections (see the config schema)."""

    advantage: str = "grpo"
    policy_loss: str = "ppo"
    agg: str = "token-mean"
    eps_low: float = 0.2
    eps_high: float = 0.28
    dual_clip_c: float | None = None
    kl: str | None = None
    kl_coef: float = 0.0
    kl_in_reward: bool = False
    entropy_coef: float = 0.0
    entropy_coef_schedule: str = "constant"
    entropy_coef_end: float = 0.0
    off_policy: str = "none"
    is_cap: float = 2.0
    is_mode: str = "truncate"
    is_level: str = "token"
    is_mask: str | None = None
    is_mask_low: float = 0.5
    is_mask_high: float = 5.0
    proximal: str = "recompute"
    proximal_bypass: str = "auto"
    dynamic_sampling: bool = False
    max_dropped_groups: int = 64
    on_max_dropped: str = "error"
    min_group_reward_std: float = 0.0
    ref_refresh_every: int = 0
    overlong: OverlongSettings = field(default_factory=OverlongSettings)
    gamma: float = 1.0
    lam: float = 1.0
    critic: bool = False
    value_clip: float = 0.2
    vf_coef: float = 0.5
    norm_length: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    # the keys the user set (a setting a loss ignores is an error only when set)
    explicit: frozenset[str] = frozenset()

    @classmethod
    def default(cls, key: str) -> Any:
        """The value `key` has when the user leaves it out."""
        f = next(f for f in dataclasses.fields(cls) if f.name == key)
        return f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]


@dataclass(frozen=True)
class ObjectiveSettings:
    """What :class:`~agentrl.learner.objective.Objective` is built from."""

    algorithm: AlgorithmSettings = field(default_factory=AlgorithmSettings)
    attribution: str = "soft"  # rollout.branching.attribution
    norm_length: int = 1024  # algorithm.norm_length, else rollout.max_tokens
    step_weight: float = 1.0  # reward.step_weight


@dataclass(frozen=True)
class TrainSettings:
    """``learner``: optimizer, batching, precision and distribution of the policy update.

    The run layer resolves ``device`` (``cpu``, ``cuda:N``) and ``weight_sharing``; the
    defaults (``auto``) are for a learner built by hand."""

    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    warmup_steps: int = 0
    schedule: str = "constant"
    batch_groups: int = 4
    micro_batch_size: int = 4
    ppo_epochs: int = 1
    minibatches: int = 1
    bf16: str = "auto"
    fp16: str = "off"
    device: str = "auto"
    gpu_memory_fraction: float | None = None
    weight_sharing: str = "auto"
    logprob_chunk: int = 512
    fused_logprobs: str = "auto"
    compile: str = "off"
    share_prompt: bool = True
    packing: bool = False
    sdpa_backend: str = "auto"
    critic_lr: float | None = None
    recompute_mlp: bool = False
    world_size: int = 1
    parallel: str = "ddp"
    cpu_offload: bool = False
    collective_timeout_s: float = 600.0

    @property
    def torch_device(self) -> torch.device:
        """The resolved ``device`` as a torch device."""
        return torch.device(self.device)


@dataclass(frozen=True)
class LoraSettings:
    """``model.lora``: adapters on the policy (peft)."""

    r: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] | str = "all-linear"


@dataclass(frozen=True)
class PolicyModelSettings:
    """``model``: what the learner loads and how it keeps activations."""

    name: str = "smollm2-135m-instruct"
    seed: int = 0
    gradient_checkpointing: bool = False
    lora: LoraSettings | None = None
    cpu_linear: str = "auto"  # auto | onednn | torch (agentrl.cpu_linear)


@dataclass(frozen=True)
class TeacherSettings:
    """One ``distill`` teacher: a model (alias, folder) run in the learner's process, or
    ``base_url``: an OpenAI-compatible server returning prompt log-probs (vLLM)."""

    model: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    timeout_s: float = 300.0

    @property
    def label(self) -> str:
        return self.base_url or self.model or "?"


@dataclass(frozen=True)
class DistillSettings:
    """``distill``: on-policy distillation (:mod:`agentrl.learner.teacher`); off when no
    teacher is named."""

    teacher: TeacherSettings | None = None
    teachers: dict[str, TeacherSettings] = field(default_factory=dict)
    task_key: str = "teacher"
    weight: float = 1.0
    reward_weight: float = 0.0

    @property
    def enabled(self) -> bool:
        return self.teacher is not None or bool(self.teachers)


@dataclass(frozen=True)
class MonitorSettings:
    """``monitors``: the per-step health metrics (``monitor/*``) and their alerts."""

    ngram: int = 4
    baseline_steps: int = 3
    # (metric, "above" | "below", threshold), in the order written
    alerts: tuple[tuple[str, str, float], ...] = ()


@dataclass(frozen=True)
class LearnerSettings:
    """Everything a :class:`~agentrl.learner.Learner` reads, decided once."""

    objective: ObjectiveSettings = field(default_factory=ObjectiveSettings)
    train: TrainSettings = field(default_factory=TrainSettings)
    model: PolicyModelSettings = field(default_factory=PolicyModelSettings)
    temperature: float = 1.0  # sampler.temperature (0 = greedy: raw logits)
    total_steps: int = 20  # orchestrator.max_steps (the lr schedule's length)
    seed: int = 0  # orchestrator.seed
    max_staleness: int = 1  # orchestrator.max_staleness
    sampler_backend: str = "hf"  # sampler.backend
    # the dtype the embedded hf sampler computes in (None: another backend's kernels)
    sampler_dtype: torch.dtype | None = None
    distill: DistillSettings = field(default_factory=DistillSettings)
    monitors: MonitorSettings = field(default_factory=MonitorSettings)
    sampler_precision: str = "auto"  # sampler.weight_precision (int8/fp8: quantized kernels)

    @property
    def algorithm(self) -> AlgorithmSettings:
        return self.objective.algorithm
