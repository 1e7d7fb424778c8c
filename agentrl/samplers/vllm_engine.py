"""What the vllm sampler starts vLLM's engine with: the ``AsyncEngineArgs`` it builds and
the user's extra ``engine_kwargs``, checked against vLLM's fields and the ones the sampler
owns. The sampler itself is :mod:`agentrl.samplers.vllm`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrl.errors import ConfigError
from agentrl.samplers.vllm_worker import WORKER_EXTENSION


def cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover
        return False


# engine settings the sampler owns: the option (or config key) that sets each
OWNED_ENGINE_ARGS = {
    "model": "model.name",
    "dtype": "the dtype option (model.dtype)",
    "max_model_len": "the max_model_len option",
    "max_num_seqs": "the max_batch_size option (sampler.max_batch_size)",
    "enforce_eager": "the enforce_eager option",
    "logprobs_mode": "nothing: processed_logprobs is our log-prob definition (module doc)",
    "max_logprobs": "the entropy_top_k option",
    "weight_transfer_config": "the weight_transport option",
    "gpu_memory_utilization": "sampler.gpu_memory_fraction",
    "worker_extension_cls": "nothing: agentrl.samplers.vllm_worker's reloads need it",
}


def check_engine_kwargs(engine_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """`engine_kwargs` if every key is a ``vllm.AsyncEngineArgs`` field the sampler does not
    set itself; else a ConfigError naming the key (and the closest field). Without vLLM
    installed the keys are checked when the engine starts."""
    from agentrl._suggest import suggest

    kwargs = dict(engine_kwargs)
    for key in kwargs:
        if key in OWNED_ENGINE_ARGS:
            raise ConfigError(
                f"engine_kwargs.{key} is set by the vllm sampler; use "
                f"{OWNED_ENGINE_ARGS[key]} instead"
            )
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs
    except ImportError:
        return kwargs
    import dataclasses

    fields = sorted(f.name for f in dataclasses.fields(AsyncEngineArgs) if f.init)
    for key in kwargs:
        if key not in fields:
            raise ConfigError(
                f"engine_kwargs.{key} is not a vllm.AsyncEngineArgs field (vLLM "
                f"{vllm_version()})" + suggest(key, fields)
            )
    return kwargs


def build_engine_args(sampler: Any) -> Any:
    """``vllm.AsyncEngineArgs`` for a :class:`~agentrl.samplers.vllm.VLLMSampler`'s options,
    its user's ``engine_kwargs`` last."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    kwargs: dict[str, Any] = {
        "model": str(sampler.model_dir),
        "dtype": sampler.dtype,
        "max_model_len": sampler.context_length,
        "max_num_seqs": sampler.max_batch_size,
        "logprobs_mode": "processed_logprobs",
        "max_logprobs": max(20, sampler.entropy_top_k),
        "enforce_eager": (not cuda_available())
        if sampler.enforce_eager is None
        else sampler.enforce_eager,
        "disable_log_stats": True,
        "seed": 0,
    }
    if sampler.weight_transport in ("ipc", "nccl"):
        kwargs["weight_transfer_config"] = {"backend": sampler.weight_transport}
    if sampler.gpu_memory_fraction is not None:
        kwargs["gpu_memory_utilization"] = sampler.gpu_memory_fraction
    # reloads that also repack a tied LM head (agentrl.samplers.vllm_worker)
    kwargs["worker_extension_cls"] = WORKER_EXTENSION
    kwargs.update(sampler.engine_kwargs)
    try:
        return AsyncEngineArgs(**kwargs)
    except TypeError as e:
        raise ValueError(f"bad vllm engine option: {e} (see vllm.AsyncEngineArgs)") from e


def vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "?"))
