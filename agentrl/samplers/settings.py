"""What a sampler backend gets of a run, resolved once by the run layer
(:mod:`agentrl.run.settings`).

    settings = resolve(cfg).sampler
    sampler = sampler_from_settings(settings)    # the backend's own from_settings

Each backend maps these to its constructor's options itself (``options_from_settings``);
field names follow the config keys (``sampler.*``, ``model.*``) so errors can name them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SamplerSettings:
    """``sampler`` plus the model it serves and the neighbours a backend needs to know."""

    backend: str = "hf"
    max_batch_size: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    seed: int | None = None
    on_update: str = "auto"  # resolved by the run layer to the backend's own policy
    device: str = "auto"  # hf: resolved (cpu, cuda:N); other backends: as written
    weight_precision: str = "auto"  # hf: auto | float32 | bfloat16 | int8 | fp8
    # hf: compute on the learner's tensors (resolved: sampler.share_learner_weights and sync)
    share_learner_weights: bool = False
    gpu_memory_fraction: float | None = None
    base_url: str | None = None
    api_key: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    model_name: str = "smollm2-135m-instruct"  # model.name
    model_dtype: str = "auto"  # model.dtype
    model_cpu_linear: str = "auto"  # model.cpu_linear (hf on a CPU)
    model_seed: int = 0  # model.seed
    learner_device: str = "auto"  # learner.device (vllm: where the weights come from)
    max_tokens: int = 1024  # rollout.max_tokens (the hf sampler's memory check)
    # the keys the user set, as dotted config keys ("sampler.device", "model.dtype"): a
    # setting a backend cannot honour is an error only when the user set it
    explicit: frozenset[str] = frozenset()

    def user_set(self, key: str) -> bool:
        """Whether the config file or an override set dotted `key` (not its default)."""
        return key in self.explicit
