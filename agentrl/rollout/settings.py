"""What the rollout engine gets of a run, resolved once by the run layer
(:mod:`agentrl.run.settings`).

    engine = RolloutEngine(env, sampler, renderer, resolve(cfg).rollout)

Field names follow the config keys (``rollout.*``, ``sampler.*`` for sampling) so errors
can name them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BranchingSettings:
    """``rollout.branching``: ARPO's entropy-triggered branching."""

    enabled: bool = False
    budget: int = 8
    initial: int = 2
    branches: int = 2
    entropy_window: int = 20
    alpha: float = 0.2
    beta: float = 0.5
    tau: float = 0.5
    mode: str = "stochastic"
    attribution: str = "soft"


@dataclass(frozen=True)
class GroupHookSettings:
    """One ``rollout.group_hooks`` entry: a registered name or module:function."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SamplingSettings:
    """``sampler``'s per-turn sampling parameters."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    seed: int | None = None


@dataclass(frozen=True)
class RolloutSettings:
    """``rollout``, the sampling parameters and the run's seed."""

    group_size: int = 8
    concurrency: int = 32
    max_turns: int = 4
    max_tool_calls: int = 8
    max_tokens: int = 1024
    on_template_mismatch: str = "error"
    infra_retries: int = 1
    episode_timeout_s: float = 300.0
    workflow: str = "episode"
    branching: BranchingSettings = field(default_factory=BranchingSettings)
    group_hooks: tuple[str | GroupHookSettings, ...] = ()
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    seed: int = 0  # orchestrator.seed: the task order and each group's sampling streams
