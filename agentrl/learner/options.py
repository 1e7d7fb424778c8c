"""``algorithm.options`` and the clip settings, routed to the functions that take them.

Each option goes to every selected function (the advantage estimator, the policy loss) that
names it as a keyword parameter or takes ``**kwargs``; an option none takes, or one that
shadows a setting the learner passes itself, is a :class:`ConfigError` naming the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from agentrl._suggest import suggest
from agentrl.algos.registry import keyword_parameters
from agentrl.errors import ConfigError, UnknownNameError

# the clip settings of algorithm.* that go to a policy loss naming them as parameters
CLIP_SETTINGS = ("eps_low", "eps_high", "dual_clip_c")

# keywords the learner passes itself, so an option may not take them over; where an
# algorithm.* field sets it, the error names that field
SET_BY_FIELD = {
    "gamma": "algorithm.gamma",
    "lam": "algorithm.lam",
    "eps_low": "algorithm.eps_low",
    "eps_high": "algorithm.eps_high",
    "dual_clip_c": "algorithm.dual_clip_c",
    "agg": "algorithm.agg",
    "norm_length": "algorithm.norm_length",
    "correction": "algorithm.off_policy",
    "is_cap": "algorithm.is_cap",
    "is_mode": "algorithm.is_mode",
    "is_level": "algorithm.is_level",
    "is_mask": "algorithm.is_mask",
    "is_mask_low": "algorithm.is_mask_low",
    "is_mask_high": "algorithm.is_mask_high",
}


def route_options(
    options: Mapping[str, Any],
    receivers: Mapping[str, Callable[..., Any]],
    reserved: frozenset[str],
) -> dict[str, dict[str, Any]]:
    """Split ``algorithm.options`` among `receivers` (a label such as ``"advantage 'grpo'"``
    -> its function): each option goes to every receiver that names it as a keyword
    parameter or takes ``**kwargs``. Raises :class:`ConfigError` for an option in
    `reserved` (the learner passes it) or one that no receiver takes."""
    routed: dict[str, dict[str, Any]] = {label: {} for label in receivers}
    signatures = {label: keyword_parameters(fn) for label, fn in receivers.items()}
    for key, value in options.items():
        if key in reserved:
            field = SET_BY_FIELD.get(key)
            fix = f"set {field} instead" if field else "remove it from algorithm.options"
            raise ConfigError(
                f"algorithm.options.{key}: '{key}' is passed by the learner itself, not an "
                f"option; {fix}"
            )
        takers = [
            label for label, (named, takes_any) in signatures.items() if takes_any or key in named
        ]
        if not takers:
            takes = []
            for label, (named, _) in signatures.items():
                own = [p for p in named if p not in reserved]
                takes.append(f"{label} takes {', '.join(own) if own else 'no options'}")
            known = [p for named, _ in signatures.values() for p in named if p not in reserved]
            raise ConfigError(
                f"algorithm.options.{key} is not an option of any selected function"
                f"{suggest(key, known)}: {'; '.join(takes)}. Remove it, or pick an "
                "algorithm that takes it"
            )
        for label in takers:
            routed[label][key] = value
    return routed


def clip_settings(alg: Any, loss_fn: Callable[..., Any]) -> dict[str, Any]:
    """The clip settings `loss_fn` takes; one set in the config that it ignores is an error."""
    named, takes_any = keyword_parameters(loss_fn)
    out = {}
    for key in CLIP_SETTINGS:
        if takes_any or key in named:
            out[key] = getattr(alg, key)
        elif key in alg.explicit:
            raise ConfigError(
                f"algorithm.{key} is set but policy loss '{alg.policy_loss}' takes no "
                f"{key}; remove algorithm.{key} or pick a loss that clips (such as ppo)"
            )
    return out


def lookup(registry: Any, name: str, field: str) -> Any:
    """``registry.get(name)``, its unknown-name error prefixed with the config field."""
    try:
        return registry.get(name)
    except UnknownNameError as e:
        raise UnknownNameError(f"{field}: {e.args[0]}") from None
