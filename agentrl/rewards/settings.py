"""What the reward pipeline gets of a run, resolved once by the run layer
(:mod:`agentrl.run.settings`): the ``reward`` section with every function's weight decided
(``reward.weights`` wins over a function's own ``weight``) and ``model_device`` resolved.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrl.learner.settings import TrainSettings


@dataclass(frozen=True)
class RewardFunctionSettings:
    """One reward (or process reward) function: ``module:function`` or ``file.py:function``."""

    fn: str
    weight: float = 1.0
    name: str | None = None  # default: the function's name


@dataclass(frozen=True)
class JudgeSettings:
    """``reward.judge``: LLM-as-judge (field meanings: the config schema)."""

    model: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    template: str = ""
    pattern: str = r"(?i)score\s*[:=]?\s*(-?\d+(?:\.\d+)?)"
    min_score: float = 0.0
    max_score: float = 10.0
    weight: float = 1.0
    max_new_tokens: int = 64
    temperature: float = 0.0
    on_unparseable: str = "error"
    samples: int = 1
    vote: str = "mean"
    principles: tuple[str, ...] = ()


@dataclass(frozen=True)
class RewardSettings:
    """``reward``: functions, a reward model, a judge, process rewards."""

    functions: tuple[RewardFunctionSettings, ...] = ()
    env_weight: float = 1.0
    model: str | None = None
    model_weight: float = 1.0
    model_device: str = "cpu"  # resolved when a reward model is set
    model_batch_size: int = 16
    model_max_length: int = 2048
    judge: JudgeSettings | None = None
    step_weight: float = 1.0
    process: tuple[RewardFunctionSettings, ...] = field(default_factory=tuple)
    process_model: str | None = None
    process_model_weight: float = 1.0

    @property
    def enabled(self) -> bool:
        return bool(
            self.functions or self.model or self.judge or self.process or self.process_model
        )


RM_LR = 5e-5  # the reward model's learning rate unless learner.lr (or --lr) is set


@dataclass(frozen=True)
class RewardModelTrainingSettings:
    """``agentrl rm train``: the base model (``model.name`` or ``--model``), its update
    (``learner.*``, device and lr decided) and the command's flags; resolved by
    :func:`agentrl.run.settings.reward_model_training_settings`."""

    model: str = "smollm2-135m-instruct"
    train: TrainSettings = field(default_factory=lambda: TrainSettings(lr=RM_LR))
    epochs: int = 1
    batch_size: int = 8
    eval_fraction: float = 0.1
    max_length: int = 1024
    seed: int = 0
