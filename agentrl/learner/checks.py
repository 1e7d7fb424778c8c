"""The rules between ``algorithm.*`` settings, checked when the objective is built so that a
contradiction fails before any model loads, naming the fields and the fix."""

from __future__ import annotations

from typing import Any

from agentrl.algos.registry import ADVANTAGES, OFF_POLICY_MASKS
from agentrl.errors import ConfigError
from agentrl.learner.options import lookup
from agentrl.learner.settings import AlgorithmSettings


def check_critic(alg: Any, needs_critic: bool) -> None:
    """``algorithm.critic`` matches whether the advantage estimator needs a value function."""
    if alg.critic and not needs_critic:
        raise ConfigError(
            f"algorithm.critic is true but algorithm.advantage is '{alg.advantage}', which "
            "uses no value function: set algorithm.critic=false, or pick an advantage "
            "that needs one (algorithm.advantage=gae)"
        )
    if needs_critic and not alg.critic:
        raise ConfigError(
            f"algorithm.advantage={alg.advantage} needs a value function: set algorithm.critic=true"
        )


def check_off_policy(alg: Any) -> None:
    """The is_* and proximal keys act only under a correction that uses them."""
    if alg.off_policy == "none":
        for key in ("is_mode", "is_level", "is_mask", "proximal", "proximal_bypass"):
            if getattr(alg, key) != AlgorithmSettings.default(key):
                raise ConfigError(
                    f"algorithm.{key}={getattr(alg, key)} has no effect with "
                    "algorithm.off_policy=none (pi_old is the behaviour policy, every "
                    "weight is 1): set algorithm.off_policy=tis or decoupled, or remove "
                    f"algorithm.{key}"
                )
    if alg.proximal == "loglinear" and alg.off_policy != "decoupled":
        raise ConfigError(
            f"algorithm.proximal=loglinear approximates decoupled PPO's proximal policy; "
            f"with algorithm.off_policy={alg.off_policy} there is none: set "
            "algorithm.off_policy=decoupled or algorithm.proximal=recompute"
        )
    if alg.is_mask is None:
        for key in ("is_mask_low", "is_mask_high"):
            if key in alg.explicit:
                raise ConfigError(
                    f"algorithm.{key} bounds a rejection mask, but algorithm.is_mask is "
                    "not set: set algorithm.is_mask=token (IcePop) or geometric, or "
                    f"remove algorithm.{key}"
                )
    else:
        lookup(OFF_POLICY_MASKS, alg.is_mask, "algorithm.is_mask")  # with suggestions
        if not alg.is_mask_low < alg.is_mask_high:
            raise ConfigError(
                f"algorithm.is_mask_low ({alg.is_mask_low}) must be below "
                f"algorithm.is_mask_high ({alg.is_mask_high})"
            )


def check_kl_in_reward(alg: Any) -> None:
    """``algorithm.kl_in_reward`` needs a KL estimator and an estimator of token rewards."""
    if not alg.kl_in_reward:
        return
    if not alg.kl or alg.kl_coef <= 0:
        raise ConfigError(
            "algorithm.kl_in_reward=true needs a KL estimator and a coefficient: set "
            "algorithm.kl (k1, k2, k3 or k3+) and algorithm.kl_coef > 0 "
            f"(got kl={alg.kl}, kl_coef={alg.kl_coef})"
        )
    if not ADVANTAGES.takes_token_rewards(alg.advantage):
        takes = [n for n in ADVANTAGES.names() if ADVANTAGES.takes_token_rewards(n)]
        raise ConfigError(
            f"algorithm.kl_in_reward=true puts a KL penalty on every token, but "
            f"algorithm.advantage={alg.advantage} takes one reward per sequence: pick "
            f"one of {', '.join(takes)}, or keep the KL in the loss "
            "(algorithm.kl_in_reward=false)"
        )


def check_dynamic_sampling(alg: Any) -> None:
    """``algorithm.min_group_reward_std`` is a threshold of dynamic sampling."""
    if alg.min_group_reward_std > 0 and not alg.dynamic_sampling:
        raise ConfigError(
            f"algorithm.min_group_reward_std={alg.min_group_reward_std} drops groups (and "
            "samples more) as dynamic sampling does: set algorithm.dynamic_sampling=true, or "
            "remove algorithm.min_group_reward_std"
        )


def check_entropy_schedule(alg: Any) -> None:
    """``algorithm.entropy_coef_end`` acts only under a schedule that moves the coefficient."""
    if alg.entropy_coef_schedule == "constant" and "entropy_coef_end" in alg.explicit:
        raise ConfigError(
            "algorithm.entropy_coef_end is set but algorithm.entropy_coef_schedule is constant "
            "(the coefficient stays algorithm.entropy_coef): set "
            "algorithm.entropy_coef_schedule=linear or cosine, or remove algorithm.entropy_coef_end"
        )
