"""Every problem of a run config at once, before anything is created or loaded.

    cfg = load_run_config("configs/demo.yaml", ["algorithm.advantage=rlo"], "train")

Pydantic's checks (types, ranges, unknown keys) and what only the run layer knows (the
registry names of ``algorithm``, the environment, the workflow and group hooks, the
preference loss, the sampler backend's options, the reward functions, the algorithm's
cross-checks) are collected into one :class:`~agentrl.errors.ConfigError`, one line per
problem, each naming where its value came from: the YAML file and line, or the ``--set``
override. A command calls this before it makes a run folder or loads a model; the
components check again when they are built (their errors stay for the Python API).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Literal

from agentrl.algos.registry import (
    ADVANTAGES,
    AGGREGATIONS,
    KL_ESTIMATORS,
    OFF_POLICY_MASKS,
    POLICY_LOSSES,
    TREE_ATTRIBUTIONS,
)
from agentrl.config import Config, RawConfig, read_config, validate_config
from agentrl.config import GroupHookConfig as Hook
from agentrl.config_sources import Problem, report
from agentrl.envs.registry import resolve as resolve_env
from agentrl.errors import ConfigError, PluginError, UnknownNameError
from agentrl.learner.objective import check_algorithm
from agentrl.preference.losses import PREFERENCE_LOSSES
from agentrl.preference.losses import check_options as check_preference_options
from agentrl.rewards import RewardPipeline
from agentrl.rollout.hooks import resolve_group_hooks
from agentrl.rollout.workflow import resolve_workflow
from agentrl.run.settings import (
    check_placement,
    learner_worker,
    objective_settings,
    reward_settings,
    sampler_settings,
)
from agentrl.samplers import backend_class, sampler_options
from agentrl.samplers.options import check_options as check_sampler_options

Purpose = Literal["train", "eval", "rollout", "serve", "sft", "preference", "online_preference"]

_EPISODES = {"train", "eval", "rollout", "serve", "online_preference"}  # build env + sampler
_USER_ERRORS = (ConfigError, PluginError, UnknownNameError)
_KEY = re.compile(r"\b(?:" + "|".join(Config.model_fields) + r")(?:\.[A-Za-z_]\w*)+")


def load_run_config(
    path: str | Path | None, overrides: list[str] | None, purpose: Purpose
) -> Config:
    """`path` with `overrides`, validated for `purpose`; a :class:`ConfigError` lists every
    problem found, each with its source."""
    raw = read_config(path, overrides)
    cfg, problems = validate_config(raw)
    problems += _name_problems(_Lookup(raw, cfg), purpose)
    if cfg is not None:  # cross-checks read a whole, valid config
        problems += _cross_problems(cfg, purpose, {p.key for p in problems})
    if problems:
        raise ConfigError(report(problems, raw.sources))
    assert cfg is not None
    return cfg


def check_run_config(cfg: Config, purpose: Purpose) -> None:
    """The run-layer checks of :func:`load_run_config` on a config built in code."""
    problems = _name_problems(_Lookup(None, cfg), purpose)
    problems += _cross_problems(cfg, purpose, {p.key for p in problems})
    if problems:
        raise ConfigError(report(problems, cfg._sources))


class _Lookup:
    """A key's value: from the validated config, else as written (else its default), so
    registry names are checked even when pydantic refused another key."""

    def __init__(self, raw: RawConfig | None, cfg: Config | None) -> None:
        self.raw, self.cfg = raw, cfg
        self.defaults = Config() if cfg is None else cfg

    def __call__(self, key: str) -> Any:
        if self.cfg is None and self.raw is not None:
            node: Any = self.raw.data
            for part in key.split("."):
                if not isinstance(node, dict) or part not in node:
                    break
                node = node[part]
            else:
                return node
        node = self.defaults
        for part in key.split("."):
            node = getattr(node, part, None)
        return node


def _name_problems(value: Callable[[str], Any], purpose: Purpose) -> list[Problem]:
    """Each registry name `purpose` uses, looked up (unknown ones with suggestions)."""
    names: list[tuple[str, Callable[[str], Any]]] = []
    if purpose == "train":
        names += [
            ("algorithm.advantage", ADVANTAGES.get),
            ("algorithm.policy_loss", POLICY_LOSSES.get),
            ("algorithm.kl", KL_ESTIMATORS.get),
            ("algorithm.agg", AGGREGATIONS.get),
            ("algorithm.is_mask", OFF_POLICY_MASKS.get),
            ("rollout.branching.attribution", TREE_ATTRIBUTIONS.get),
        ]
    if purpose in _EPISODES or purpose in ("sft", "preference"):
        names.append(("env.name", resolve_env))
    if purpose in _EPISODES:
        names.append(("rollout.workflow", resolve_workflow))
    if purpose in ("preference", "online_preference"):
        names.append(("preference.loss", PREFERENCE_LOSSES.get))
    problems = []
    for key, lookup in names:
        name = value(key)
        if isinstance(name, str):  # else null (off), or a wrong type pydantic reports
            problems += _attempt(partial(lookup, name), key)
    hooks = value("rollout.group_hooks")
    well_formed = isinstance(hooks, list) and all(isinstance(h, str | Hook) for h in hooks)
    if purpose in _EPISODES and well_formed:  # else pydantic reports the entries
        problems += _attempt(partial(resolve_group_hooks, hooks), "rollout.group_hooks")
    return problems


def _cross_problems(cfg: Config, purpose: Purpose, bad_names: set[str]) -> list[Problem]:
    """Checks that read several keys, each on its own (one failing hides no other); those
    that need a name found unknown (`bad_names`) are skipped."""
    checks: list[Callable[[], Any]] = []
    if purpose == "train":
        if not any(k.startswith(("algorithm.", "rollout.branching.")) for k in bad_names):
            checks.append(lambda: check_algorithm(objective_settings(cfg)))
        if cfg.orchestrator.backend == "local":  # Ray actors resolve devices on their nodes
            checks += [lambda: learner_worker(cfg), lambda: check_placement(cfg)]
    if purpose in _EPISODES:
        checks.append(lambda: _sampler_options(cfg))
        if cfg.reward.enabled:
            checks.append(lambda: RewardPipeline.check(reward_settings(cfg)))
    preference = purpose in ("preference", "online_preference")
    if preference and cfg.preference.options and "preference.loss" not in bad_names:
        options = dict(cfg.preference.options)
        checks.append(lambda: check_preference_options(cfg.preference.loss, options))
    return [p for check in checks for p in _attempt(check)]


def _attempt(check: Callable[[], Any], key: str | None = None) -> list[Problem]:
    """`check`'s user error as a problem of `key` (default: the first key its message
    names; the others it names are shown with their sources too)."""
    try:
        check()
    except _USER_ERRORS as e:
        message = str(e)
        keys = list(dict.fromkeys(k.rstrip(".") for k in _KEY.findall(message)))
        if key is None:
            key = keys[0] if keys else ""
        related = tuple(k for k in keys if k != key)
        return [Problem(key, message.removeprefix(f"{key}: "), related)]
    return []


def _sampler_options(cfg: Config) -> None:
    try:
        check_sampler_options(
            backend_class(cfg.sampler.backend), sampler_options(sampler_settings(cfg))
        )
    except TypeError as e:  # an unknown option, named with the backend's known ones
        raise ConfigError(f"sampler.options: {e}") from None


__all__ = ["Purpose", "check_run_config", "load_run_config"]
