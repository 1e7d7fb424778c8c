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
from pathlib import Path
from typing import Any, Literal

from agentrl.config import Config, RawConfig, read_config, validate_config
from agentrl.config_sources import Problem, Sources, report
from agentrl.errors import ConfigError, PluginError, UnknownNameError

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
    from agentrl.algos.registry import (
        ADVANTAGES,
        AGGREGATIONS,
        KL_ESTIMATORS,
        OFF_POLICY_MASKS,
        POLICY_LOSSES,
        TREE_ATTRIBUTIONS,
    )

    checks: list[tuple[str, Callable[[str], Any]]] = []
    if purpose == "train":
        checks += [
            ("algorithm.advantage", ADVANTAGES.get),
            ("algorithm.policy_loss", POLICY_LOSSES.get),
            ("algorithm.kl", KL_ESTIMATORS.get),
            ("algorithm.agg", AGGREGATIONS.get),
            ("algorithm.is_mask", OFF_POLICY_MASKS.get),
            ("rollout.branching.attribution", TREE_ATTRIBUTIONS.get),
        ]
    if purpose in _EPISODES or purpose in ("sft", "preference"):
        from agentrl.envs.registry import resolve

        checks.append(("env.name", resolve))
    if purpose in _EPISODES:
        from agentrl.rollout.hooks import resolve_group_hooks
        from agentrl.rollout.workflow import resolve_workflow

        checks.append(("rollout.workflow", resolve_workflow))
        hooks = value("rollout.group_hooks")
        if isinstance(hooks, list) and all(isinstance(h, str) or hasattr(h, "name") for h in hooks):
            checks.append(("rollout.group_hooks", lambda _: resolve_group_hooks(hooks)))
    if purpose in ("preference", "online_preference"):
        from agentrl.preference.losses import PREFERENCE_LOSSES

        checks.append(("preference.loss", PREFERENCE_LOSSES.get))
    problems = []
    for key, check in checks:
        name = value(key) if key != "rollout.group_hooks" else None
        if key != "rollout.group_hooks" and not isinstance(name, str):
            continue  # null (off), or a wrong type pydantic reports
        try:
            check(name)
        except _USER_ERRORS as e:
            message = str(e)
            problems.append(Problem(key, message.removeprefix(f"{key}: ")))
    return problems


def _cross_problems(cfg: Config, purpose: Purpose, bad_names: set[str]) -> list[Problem]:
    """Checks that read several keys, each on its own (one failing hides no other); those
    that need a name found unknown (`bad_names`) are skipped."""
    checks: list[Callable[[], Any]] = []
    if purpose == "train":
        from agentrl.devices import check_placement
        from agentrl.learner.objective import check_algorithm
        from agentrl.run.runtime import learner_worker

        if not any(k.startswith(("algorithm.", "rollout.branching.")) for k in bad_names):
            checks.append(lambda: check_algorithm(cfg))
        if cfg.orchestrator.backend == "local":  # Ray actors resolve devices on their nodes
            checks += [lambda: learner_worker(cfg), lambda: check_placement(cfg)]
    if purpose in _EPISODES:
        checks.append(lambda: _sampler_options(cfg))
        if cfg.reward.enabled:
            from agentrl.rewards import RewardPipeline

            checks.append(lambda: RewardPipeline.check(cfg))
    preference = purpose in ("preference", "online_preference")
    if preference and cfg.preference.options and "preference.loss" not in bad_names:
        from agentrl.preference.losses import check_options

        checks.append(lambda: check_options(cfg.preference.loss, dict(cfg.preference.options)))
    problems = []
    for check in checks:
        try:
            check()
        except _USER_ERRORS as e:
            problems.append(_problem_of(str(e)))
    return problems


def _sampler_options(cfg: Config) -> None:
    from agentrl.samplers import backend_class, sampler_options
    from agentrl.samplers.options import check_options

    try:
        check_options(backend_class(cfg.sampler.backend), sampler_options(cfg))
    except TypeError as e:  # an unknown option, named with the backend's known ones
        raise ConfigError(f"sampler.options: {e}") from None


def _problem_of(message: str) -> Problem:
    """A cross-check's error as a problem of the first key it names (the others it names
    are shown with their sources too)."""
    keys = list(dict.fromkeys(k.rstrip(".") for k in _KEY.findall(message)))
    key = keys[0] if keys else ""
    return Problem(key, message.removeprefix(f"{key}: "), tuple(keys[1:]))


__all__ = ["Purpose", "Sources", "check_run_config", "load_run_config"]
