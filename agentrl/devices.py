"""Where each role computes: device names resolved and checked, GPU memory budgets per role.

    resolve_device("auto", "sampler.device")     # cuda:0 when CUDA is present, else cpu
    check_budgets({"sampler": (gpu, 0.3), "learner": (gpu, 0.6)})  # by agentrl.run.settings
    check_memory(0.6, "learner", need_bytes, device)   # once the model's size is known
    limit_process_memory({"sampler": (gpu, 0.3)})      # the CUDA cap of this process

The hf sampler (``sampler.device``) and the learner with its critic and reference model
(``learner.device``) may share one GPU or sit on different ones (``cuda:0`` / ``cuda:1``).
A budget (``sampler.gpu_memory_fraction`` / ``learner.gpu_memory_fraction``) is checked
at start against what the role's weights and optimizer state need, then enforced through
``torch.cuda.set_per_process_memory_fraction`` for the process the role runs in (a
thread learner shares the sampler's process, so that process gets the sum).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from agentrl.errors import ConfigError

GiB = 2**30

# bytes per parameter the learner holds: float32 master weights, gradients and AdamW's two
# moments for what it trains; float32 weights alone for what it does not (a LoRA base)
TRAINED_BYTES = 4 + 4 + 8
FROZEN_BYTES = 4


def resolve_device(name: str, key: str) -> torch.device:
    """`name` (``auto``, ``cpu``, ``cuda``, ``cuda:N``) as a torch device; ``auto`` = the
    current CUDA device when CUDA is present, else cpu. `key` (the config key) is named in
    the error for a device this machine does not have."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError(
            f"{key}={name!r} is not a device: use auto, cpu, cuda or cuda:N"
        ) from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ConfigError(f"{key}={name!r}: only cpu and cuda devices are supported; use auto")
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ConfigError(
            f"{key}={name!r} but this machine has no usable CUDA device (torch "
            f"{torch.__version__}, {build}); set {key}=auto (CUDA when present) or {key}=cpu"
        )
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= count:
        raise ConfigError(
            f"{key}={name!r} but this machine has {count} CUDA device(s) (cuda:0..cuda:"
            f"{count - 1}); pick one of those or set {key}=auto"
        )
    return torch.device("cuda", index)


# a role's place: its resolved device and its share of that GPU's memory (None: no budget)
Budget = tuple[torch.device, float | None]


def sharing_kind(setting: str, device: torch.device) -> str:
    """``learner.weight_sharing`` for a learner on `device`: ``cuda_ipc`` or
    ``shared_memory`` (``auto`` = CUDA IPC exactly when the learner is on CUDA)."""
    if setting == "auto":
        return "cuda_ipc" if device.type == "cuda" else "shared_memory"
    if setting == "cuda_ipc" and device.type != "cuda":
        raise ConfigError(
            f"learner.weight_sharing=cuda_ipc needs the learner on CUDA (it is on {device}); "
            "set learner.weight_sharing=auto or shared_memory, or learner.device=cuda"
        )
    if setting not in ("cuda_ipc", "shared_memory"):
        raise ConfigError(
            f"learner.weight_sharing={setting!r}: use auto, cuda_ipc or shared_memory"
        )
    return setting


def check_budgets(budgets: Mapping[str, Budget]) -> None:
    """Budgets of the sampler and the learner on one GPU add up to at most the whole GPU;
    a ConfigError naming both keys and the fix otherwise."""
    if "sampler" not in budgets or "learner" not in budgets:
        return
    (device, sampler), (learner_device, learner) = budgets["sampler"], budgets["learner"]
    if device != learner_device or device.type != "cuda" or sampler is None or learner is None:
        return
    if sampler + learner > 1.0 + 1e-9:
        raise ConfigError(
            f"sampler.gpu_memory_fraction={sampler} + learner.gpu_memory_fraction={learner} "
            f"= {sampler + learner:g} > 1 on {device}, which both share: lower them, or put "
            "the roles on two GPUs (learner.device=cuda:1)"
        )


def learner_bytes(n_params: int, n_trained: int, *, reference: bool = False) -> int:
    """What the learner's weights, gradients and AdamW state take (activations come on top);
    `reference` adds a float32 copy of the policy for the KL term."""
    frozen = n_params - n_trained
    return n_trained * TRAINED_BYTES + frozen * FROZEN_BYTES + (n_params * 4 if reference else 0)


def kv_cache_bytes(model_config: Any, rows: int, tokens: int, element_size: int) -> int:
    """Keys and values of `rows` sequences of `tokens` tokens (0 when the config does not
    say its layer and head sizes)."""
    layers = getattr(model_config, "num_hidden_layers", None)
    heads = getattr(model_config, "num_attention_heads", None)
    hidden = getattr(model_config, "hidden_size", None)
    if not (layers and heads and hidden):
        return 0
    kv_heads = getattr(model_config, "num_key_value_heads", None) or heads
    head_dim = getattr(model_config, "head_dim", None) or hidden // heads
    return 2 * layers * kv_heads * head_dim * element_size * rows * tokens


def sampler_bytes(model: Any, rows: int, tokens: int) -> tuple[int, str]:
    """What the hf sampler holds at its fullest: its weights, and a KV cache of `rows`
    sequences of `tokens` tokens (``sampler.max_batch_size`` x ``rollout.max_tokens``)."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    element = next(model.parameters()).element_size()
    kv = kv_cache_bytes(model.config, rows, tokens, element)
    what = (
        f"weights {weights / GiB:.2f} GiB in {model.dtype} + KV cache of {rows} sequences x "
        f"{tokens} tokens {kv / GiB:.2f} GiB"
    )
    return weights + kv, what


def fits(need_bytes: int, fraction: float, total_bytes: int) -> bool:
    return need_bytes <= fraction * total_bytes


def budget_error(
    role: str, fraction: float, need_bytes: int, total_bytes: int, device: torch.device, what: str
) -> ConfigError:
    fix = {
        "learner": "raise learner.gpu_memory_fraction, train a LoRA adapter (model.lora), or "
        "put the learner on another GPU (learner.device=cuda:1)",
        "sampler": "raise sampler.gpu_memory_fraction, lower sampler.max_batch_size or "
        "rollout.max_tokens, load the sampler in a smaller dtype (model.dtype=bfloat16), or "
        "put it on another GPU (sampler.device=cuda:1)",
    }[role]
    return ConfigError(
        f"{role}.gpu_memory_fraction={fraction}: the {role} needs about "
        f"{need_bytes / GiB:.2f} GiB on {device} ({what}) but its budget is "
        f"{fraction * total_bytes / GiB:.2f} GiB of {total_bytes / GiB:.2f} GiB; {fix}"
    )


def check_memory(
    fraction: float | None, role: str, need_bytes: int, device: torch.device, what: str
) -> None:
    """Raise a :class:`ConfigError` when `role`'s budget (``<role>.gpu_memory_fraction``) on
    `device` cannot hold `need_bytes` (nothing to check on CPU or without a budget)."""
    if fraction is None or device.type != "cuda":
        return
    total = torch.cuda.get_device_properties(device).total_memory
    if not fits(need_bytes, fraction, total):
        raise budget_error(role, fraction, need_bytes, total, device, what)


def limit_process_memory(budgets: Mapping[str, Budget]) -> None:
    """Cap this process's CUDA allocations on each GPU at the sum of the budgets of the
    roles it runs there (`budgets`: only those; a role without a budget leaves its GPU
    uncapped)."""
    sums: dict[torch.device, float] = {}
    uncapped: set[torch.device] = set()
    for device, fraction in budgets.values():
        if device.type != "cuda":
            continue
        if fraction is None:
            uncapped.add(device)
        else:
            sums[device] = sums.get(device, 0.0) + fraction
    for device, fraction in sums.items():
        if device not in uncapped:
            torch.cuda.set_per_process_memory_fraction(min(fraction, 1.0), device)


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`x` on `device`; a host tensor goes to a CUDA device through pinned memory without
    the host waiting for it (a copy from ordinary host memory synchronises: the learner
    makes several per micro-batch). Elsewhere a plain ``.to``."""
    if x.device.type == "cpu" and device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def to_host(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Device tensors read to the host in one transfer (one synchronisation for all)."""
    if not tensors:
        return []
    flat = torch.cat([t.detach().reshape(-1) for t in tensors]).cpu()
    return [
        part.reshape(t.shape)
        for part, t in zip(flat.split([t.numel() for t in tensors]), tensors, strict=True)
    ]
