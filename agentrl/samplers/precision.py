"""The hf sampler's weight precision (``sampler.weight_precision``): its copy of the policy
may be held lower than the learner's float32 masters, quantized by torchao.

    dtype = load_dtype_for("int8", model_dtype)       # what the model is loaded in
    quantized = quantize(model, "int8")               # names of the weights it replaced
    load_weights(model, state, "int8", quantized)     # each publish: copy + requantize

* ``auto``: the model's own dtype (``model.dtype``), nothing quantized.
* ``float32`` / ``bfloat16``: the sampler's copy in that dtype whatever ``model.dtype`` says
  (bfloat16 on a CPU without bf16 instructions computes in float32, see
  :func:`agentrl.models.cpu_dtype`).
* ``int8``: torchao int8 weight-only, per output row, on every linear layer but the LM head
  (the head stays in the compute dtype: its error goes straight into every log-prob);
  activations stay in the model's dtype. CPU or GPU. In eager mode torchao's kernel
  converts the int8 weight back before the matmul, so this saves memory (a quarter of the
  float32 linear weights) rather than decode time; see docs/performance.md.
* ``fp8``: torchao float8 (e4m3) weights and dynamically quantized float8 activations, per
  row, on the same layers; needs a CUDA GPU with float8 matmuls (compute capability 8.9+:
  L4, H100, ...), refused elsewhere.

The learner keeps float32 and publishes full-precision weights; the sampler quantizes its
own copy on each publish, so behaviour log-probs are the quantized model's and the
learner's off-policy corrections (``algorithm.off_policy``: TIS, MIS, IcePop) see the gap.
"""

from __future__ import annotations

from typing import Any

import torch

import agentrl.models  # noqa: F401  (filters torchao's import warnings)
from agentrl.cpu import release_freed_memory
from agentrl.errors import ConfigError
from agentrl.samplers.hf_requests import copy_in_place

PRECISIONS = ("auto", "float32", "bfloat16", "int8", "fp8")
QUANTIZED = ("int8", "fp8")
_KEY = "sampler.weight_precision"


def check_precision(precision: str) -> str:
    """`precision` if it is one of :data:`PRECISIONS`, else a ConfigError naming the key."""
    if precision not in PRECISIONS:
        raise ConfigError(f"{_KEY} must be one of {', '.join(PRECISIONS)} (got {precision!r})")
    return precision


def load_dtype_for(precision: str, model_dtype: str | None) -> str | None:
    """The dtype (a ``model.dtype`` value, None = auto) the sampler loads its model in."""
    if check_precision(precision) in ("float32", "bfloat16"):
        return precision
    return model_dtype


def _torchao() -> Any:
    import torchao.quantization  # its import noise is filtered in agentrl.models

    return torchao.quantization


def _config(precision: str) -> Any:
    try:
        tq = _torchao()
    except ImportError as e:
        raise ConfigError(
            f"{_KEY}={precision} needs torchao: pip install 'agentrl[lowprec]' "
            f"(or set {_KEY}: auto) ({e})"
        ) from e
    # set_inductor_config=False: torchao would otherwise change global inductor settings,
    # which the learner's torch.compile shares in this process
    if precision == "int8":
        return tq.Int8WeightOnlyConfig(granularity=tq.PerRow(), set_inductor_config=False)
    return tq.Float8DynamicActivationFloat8WeightConfig(
        granularity=tq.PerRow(), set_inductor_config=False
    )


def check_device(precision: str, device: torch.device) -> None:
    """fp8 needs a CUDA device with float8 matmuls: anything else is a ConfigError."""
    if precision != "fp8":
        return
    if device.type != "cuda":
        raise ConfigError(
            f"{_KEY}=fp8 needs a CUDA GPU with float8 matmuls (compute capability 8.9+: L4, "
            f"H100, ...); the sampler is on {device}. On a CPU use int8 (or bfloat16 where the "
            "CPU has bf16 instructions)"
        )
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        raise ConfigError(
            f"{_KEY}=fp8 needs compute capability 8.9+ (this GPU: {major}.{minor}); use int8 "
            "or bfloat16"
        )


def _head(model: Any) -> Any:
    get = getattr(model, "get_output_embeddings", None)
    return get() if get is not None else None


def quantize(model: Any, precision: str) -> frozenset[str]:
    """Quantize `model`'s linear layers (not the LM head) in place for `precision`; the
    state-dict names of the weights it replaced (empty for auto/float32/bfloat16)."""
    if check_precision(precision) not in QUANTIZED:
        return frozenset()
    device = next(model.parameters()).device
    check_device(precision, device)
    config = _config(precision)
    head = _head(model)
    names = frozenset(
        f"{name}.weight"
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module is not head
    )
    _torchao().quantize_(
        model,
        config,
        filter_fn=lambda m, _fqn: isinstance(m, torch.nn.Linear) and m is not head,
    )
    with torch.no_grad():
        for p in model.parameters():
            if not hasattr(p, "qdata"):  # own memory: a checkpoint's mapping can close
                p.data = p.data.clone()
    release_freed_memory()  # the float weights and the quantizer's temporaries
    return names


def load_weights(
    model: Any,
    state: dict[str, torch.Tensor],
    precision: str,
    quantized: frozenset[str],
    share: bool = False,
) -> None:
    """Copy `state` (full precision, the sampler's names) into `model`: in place for the
    weights that are not quantized (CUDA graphs read that storage; with `share`, the
    published tensors themselves, see :func:`copy_in_place`), requantized from the new
    values for those in `quantized`."""
    plain = {name: t for name, t in state.items() if name not in quantized}
    copy_in_place(model, plain, share=share)
    if not quantized:
        return
    config = _config(precision)
    quantize_ = _torchao().quantize_
    with torch.no_grad():
        for name in quantized:
            path = name.rsplit(".", 1)[0]
            module = model.get_submodule(path)
            old = module.weight
            dtype = getattr(old, "dtype", None)  # torchao tensors report the original dtype
            fresh = state[name].detach().to(device=old.device, dtype=dtype)
            module.weight = torch.nn.Parameter(fresh, requires_grad=False)
            quantize_(module, config)  # the module itself is the root the filter sees
    release_freed_memory()  # the quantizer's temporaries, kept by the allocator otherwise
