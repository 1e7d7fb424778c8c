"""Samplers: hf (embedded), vllm, openai.

    sampler = create_sampler("hf", model="tiny-llama")            # a name: loaded here
    sampler = create_sampler("hf", model=(model, tokenizer))      # or an already-loaded pair
    gen = await sampler.generate(prompt_ids, SamplingParams(temperature=0.7))

Backends are imported lazily, so ``vllm`` is only needed when it is asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

from agentrl._suggest import suggest
from agentrl.errors import UnknownNameError
from agentrl.samplers.base import Generation, Sampler, SamplingParams, WeightsLike

__all__ = ["BACKENDS", "Generation", "Sampler", "SamplingParams", "WeightsLike", "create_sampler"]

# backend name -> "module:Class"
BACKENDS: dict[str, str] = {
    "hf": "agentrl.samplers.hf:HFSampler",
    "vllm": "agentrl.samplers.vllm:VLLMSampler",
    "openai": "agentrl.samplers.openai_compat:OpenAISampler",
}


def _backend_class(backend: str) -> type[Sampler]:
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
    cls = _backend_class(backend)
    if backend != "hf":
        _check_options(cls, options)
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
        from agentrl.models import load_model

        hf_model, tokenizer = load_model(
            model, dtype=dtype, device=device, seed=options.get("seed") or 0
        )
    _check_options(cls, options)
    return cls(hf_model, tokenizer, **options)


def _check_options(cls: type, options: dict[str, Any]) -> None:
    import inspect

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
