"""Preference optimisation (DPO and its family): losses, data, the trainer, pairs from
rollouts and ARPO trees. See docs/preference.md."""

from agentrl.preference.data import Completion, PreferencePair, UnpairedExample
from agentrl.preference.losses import (
    PREFERENCE_LOSSES,
    PairLogps,
    PreferenceLoss,
    UnpairedLogps,
    preference_loss,
    register_preference_loss,
)
from agentrl.preference.rollouts import group_pair, pairs_from_groups, step_pairs

__all__ = [
    "PREFERENCE_LOSSES",
    "Completion",
    "PairLogps",
    "PreferenceLoss",
    "PreferencePair",
    "UnpairedExample",
    "UnpairedLogps",
    "group_pair",
    "pairs_from_groups",
    "preference_loss",
    "register_preference_loss",
    "step_pairs",
]
