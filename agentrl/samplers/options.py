"""What a run's config gives a sampler backend, the parts every backend shares.

Each backend's own mapping is its ``from_settings`` / ``options_from_settings`` classmethod
(:class:`~agentrl.samplers.hf.HFSampler`, ``VLLMSampler``, ``OpenAISampler``); here are the
checks they all make and the ``sampler.on_update`` policy, resolved from the backend's
declared default and the policies it cannot honour. First-class settings
(``sampler.max_batch_size``, ``on_update``, ``device``, ``model.dtype``) are forwarded
where a backend honours them; one a backend cannot honour, set by the user, is a :class:`ConfigError`.
``sampler.options`` holds backend-specific extras and may not repeat those.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from agentrl._suggest import suggest
from agentrl.errors import ConfigError

if TYPE_CHECKING:
    from agentrl.samplers.base import Sampler
    from agentrl.samplers.settings import SamplerSettings

FIRST_CLASS = {
    "max_batch_size",
    "on_update",
    "drain_on_update",
    "device",
    "dtype",
    "weight_precision",
}


def shared_options(s: SamplerSettings, *, remote: bool = False) -> dict[str, Any]:
    """``sampler.options``, after the checks every backend makes; `remote`: the backend
    talks to a server elsewhere (``sampler.base_url`` / ``api_key`` are for it)."""
    doubled = sorted(FIRST_CLASS & set(s.options))
    if doubled:
        raise ConfigError(
            f"sampler.options.{doubled[0]} repeats a first-class setting: set "
            + {"dtype": "model.dtype", "drain_on_update": "sampler.on_update=drain"}.get(
                doubled[0], f"sampler.{doubled[0]}"
            )
            + " instead"
        )
    if s.weight_precision != "auto" and s.backend != "hf":
        raise ConfigError(
            f"sampler.weight_precision={s.weight_precision} is for sampler.backend=hf (this run "
            f"uses {s.backend}); remove it (vllm: sampler.options.engine_kwargs: "
            "{quantization: fp8})"
        )
    remote_keys = [key for key in ("base_url", "api_key") if getattr(s, key)]
    if not remote and remote_keys:
        raise ConfigError(
            f"sampler.{remote_keys[0]} is for sampler.backend=openai (this run uses "
            f"{s.backend}); remove it or set sampler.backend=openai"
        )
    return dict(s.options)


def resolve_on_update(s: SamplerSettings, cls: type[Sampler]) -> str:
    """``sampler.on_update`` resolved to ``keep``, ``reprefill`` or ``drain`` for backend
    `cls` (``auto`` = the backend's own default); a policy the backend cannot honour is a
    :class:`ConfigError` naming the key."""
    policy = s.on_update
    if policy == "auto":
        policy = cls.on_update_default
    why = cls.on_update_cannot.get(policy)
    if why:
        raise ConfigError(
            f"sampler.on_update={policy} cannot be honoured by sampler.backend={cls.backend}: {why}"
        )
    return policy


def check_options(cls: type, options: dict[str, Any]) -> None:
    """A keyword the backend's constructor does not take is a TypeError naming the known ones."""
    known = [
        name
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    for name in options:
        if name not in known:
            raise TypeError(
                f"unknown option {name!r} for the {cls.backend} sampler; known: {', '.join(known)}"
                + suggest(name, known)
            )
