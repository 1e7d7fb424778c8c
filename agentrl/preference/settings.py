"""What a preference run (``agentrl dpo``, offline or online) needs, resolved once by the run
layer (:func:`agentrl.run.settings.preference_settings`).

    settings = preference_settings(cfg)        # frozen; learner.device already decided
    trainer = PreferenceTrainer(model, settings, pad_id=pad_id)

The loss fields mirror ``preference.*``; ``train`` is the learner's resolved ``learner.*``
(the trainer core, precision and ranks read it), ``model`` the policy's ``model.*``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentrl.envs.dataset import DataSettings
from agentrl.learner.settings import PolicyModelSettings, TrainSettings
from agentrl.training.settings import ToolSource


@dataclass(frozen=True)
class PreferenceSettings:
    """``preference.*`` with the policy, learner and data settings it trains with."""

    loss: str = "dpo"
    beta: float | None = None
    options: dict[str, Any] = field(default_factory=dict)
    epochs: int = 1
    batch_size: int = 8
    max_length: int = 2048
    eval_fraction: float = 0.1
    checkpoint_every: int = 0
    seed: int = 0
    rounds: int = 3
    groups_per_round: int = 8
    epochs_per_round: int = 1
    min_reward_gap: float = 0.0
    step_pairs: bool = True
    train: TrainSettings = field(default_factory=TrainSettings)  # learner.*, device resolved
    model: PolicyModelSettings = field(default_factory=PolicyModelSettings)
    chat_template: str | None = None  # model.chat_template
    tools: ToolSource | None = None  # env, only when the config names one
    data: DataSettings = field(default_factory=DataSettings)
    config_yaml: str = ""  # the whole config, written to RUN/config.yaml
