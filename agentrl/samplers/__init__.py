"""Samplers: hf (embedded), vllm, openai.

    sampler = create_sampler("hf", model="tiny-llama")            # a name: loaded here
    sampler = create_sampler("hf", model=(model, tokenizer))      # or an already-loaded pair
    gen = await sampler.generate(prompt_ids, SamplingParams(temperature=0.7))

    sampler = sampler_from_settings(resolve(cfg).sampler)         # what a run's config asks for

Backends are imported when asked for (``vllm`` itself only when its engine starts). Each
maps the run's resolved sampler settings to its own options (``from_settings``); a run has
no per-backend code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agentrl._suggest import suggest
from agentrl.errors import UnknownNameError
from agentrl.models import load_model
from agentrl.samplers.base import Generation, Sampler, SamplingParams
from agentrl.samplers.options import check_options, resolve_on_update
from agentrl.types import WeightsLike

if TYPE_CHECKING:
    from agentrl.samplers.settings import SamplerSettings

__all__ = [
    "BACKENDS",
    "Generation",
    "Sampler",
    "SamplingParams",
    "WeightsLike",
    "backend_class",
    "create_sampler",
    "on_update_policy",
    "sampler_from_settings",
    "sampler_options",
]

# backend name -> "module:Class"
BACKENDS: dict[str, str] = {
    "hf": "agentrl.samplers.hf:HFSampler",
    "vllm": "agentrl.samplers.vllm:VLLMSampler",
    "openai": "agentrl.samplers.openai_compat:OpenAISampler",
}


def backend_class(backend: str) -> type[Sampler]:
    """The class of sampler backend `backend` (imported now)."""
    if backend not in BACKENDS:
        raise UnknownNameError(
            f"unknown sampler backend {backend!r}; choose one of {', '.join(BACKENDS)}"
            + suggest(backend, BACKENDS)
        )
    module_name, class_name = BACKENDS[backend].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def create_sampler(
    backend: str = "hf", model: Any = "smollm2-135m-instruct", **options: Any
) -> Sampler:
    """Build a sampler. `model` is a name/path (alias, hub id, folder, .gguf) or, for ``hf``,
    an already-loaded ``(model, tokenizer)`` pair.

    ``hf`` options: ``dtype`` (default ``"auto"``: bf16 where the CPU/GPU has it, fp32 for
    random test models), ``device`` (``"auto"``: cuda when available), ``seed`` (random aliases
    and the unseeded sampling stream), plus everything :class:`~agentrl.samplers.hf.HFSampler`
    takes (``max_batch_size``, ``max_context``, ``on_update``, ...). Other backends get
    `model` and `options` unchanged.
    """
    cls = backend_class(backend)
    if backend != "hf":
        check_options(cls, options)
        return cls(model=model, **options)

    dtype = options.pop("dtype", None)
    device = options.pop("device", "auto")
    if device in (None, "auto"):
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if isinstance(model, tuple | list):
        if len(model) != 2:
            raise ValueError("model must be a name or a (model, tokenizer) pair")
        hf_model, tokenizer = model
    else:
        hf_model, tokenizer = load_model(
            model, dtype=dtype, device=device, seed=options.get("seed") or 0
        )
    check_options(cls, options)
    return cls(hf_model, tokenizer, **options)


def sampler_from_settings(settings: SamplerSettings) -> Sampler:
    """The sampler ``settings.backend`` names, built by that backend from `settings`
    (blocking: ``hf`` loads its own copy of the model)."""
    return backend_class(settings.backend).from_settings(settings)


def sampler_options(settings: SamplerSettings) -> dict[str, Any]:
    """The keyword options `settings` give their sampler backend (see
    :mod:`agentrl.samplers.options`)."""
    return backend_class(settings.backend).options_from_settings(settings)


def on_update_policy(settings: SamplerSettings) -> str:
    """``sampler.on_update`` resolved for the run's backend: ``keep``, ``reprefill`` or
    ``drain``."""
    return resolve_on_update(settings, backend_class(settings.backend))
