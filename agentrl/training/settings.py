"""What ``agentrl sft`` needs, resolved once by the run layer
(:func:`agentrl.run.settings.sft_settings`, the CLI flags applied as overrides).

    report = train_sft(data, out, sft_settings(cfg, epochs=3, lr=1e-2))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentrl.learner.settings import PolicyModelSettings, TrainSettings

SFT_LR = 1e-5  # SFT's learning rate unless learner.lr (or --lr) is set


@dataclass(frozen=True)
class ToolSource:
    """``env``: the environment whose tools a row without its own tools is rendered with."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SFTSettings:
    """The policy (``model.*``), its update (``learner.*``, device and lr decided) and the
    flags of ``agentrl sft``."""

    model: PolicyModelSettings = field(default_factory=PolicyModelSettings)
    train: TrainSettings = field(default_factory=lambda: TrainSettings(lr=SFT_LR))
    chat_template: str | None = None  # model.chat_template
    tools: ToolSource | None = None  # env, only when the config names one
    epochs: int = 1
    batch_size: int = 8
    max_length: int = 2048
    eval_fraction: float = 0.0
    seed: int = 0
