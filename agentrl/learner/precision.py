"""Where and in what precision the learner computes: device, autocast dtype, attention kernel.

Master weights stay float32; bf16 / fp16 are used only inside autocast. bf16 where the
device computes it natively; ``learner.bf16=on`` on a CPU without bf16 instructions says so
in one log line and trains in float32 (torch's generic bf16 kernels there are several times
slower than float32). fp16 only when ``learner.fp16=on`` asks for it, always with a gradient scaler (:meth:`Precision.grad_scaler`):
fp16's narrow exponent underflows small gradients unless the loss is scaled up first.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from agentrl.algos.logprobs import cast_once
from agentrl.learner.settings import TrainSettings

log = logging.getLogger(__name__)

# longest micro-batch (tokens) that gets the math attention kernel on CPU with
# sdpa_backend=auto: it is faster than the flash kernel there for short sequences only
# (benchmarks/learner_step.py measures both)
MATH_ATTENTION_MAX_TOKENS = 256


def resolve_device(name: str, key: str = "learner.device") -> torch.device:
    """``auto`` -> cuda when available, else cpu; a device this machine lacks is a
    ConfigError naming `key` (see :mod:`agentrl.devices`)."""
    from agentrl.devices import resolve_device as resolve

    return resolve(name, key)


def bf16_supported(device: torch.device) -> bool:
    """Whether `device` computes bfloat16 natively."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        with contextlib.suppress(Exception):
            from agentrl.models import cpu_supports_bf16

            return cpu_supports_bf16()
        with contextlib.suppress(Exception):
            return bool(torch.cpu._is_avx512_bf16_supported())
    return False


@dataclass(frozen=True)
class Precision:
    """The device, the autocast dtype and the attention kernel of every learner forward."""

    device: torch.device
    bf16: bool
    sdpa_backend: str = "auto"  # auto | torch | math | flash
    fp16: bool = False  # never together with bf16 (the config refuses both on)

    def __post_init__(self) -> None:
        if self.bf16 and self.fp16:
            raise ValueError("Precision: bf16 and fp16 cannot both be on")

    @classmethod
    def from_settings(cls, lcfg: TrainSettings) -> Precision:
        """``learner.bf16`` / ``fp16`` on the resolved ``learner.device``."""
        device = resolve_device(lcfg.device)
        fp16 = lcfg.fp16 == "on"
        native = bf16_supported(device)
        bf16 = not fp16 and (lcfg.bf16 == "on" or lcfg.bf16 == "auto") and native
        if lcfg.bf16 == "on" and not native and device.type == "cpu":
            log.warning(
                "learner.bf16=on, but this CPU has no bf16 instructions (AVX-512 BF16 or "
                "AMX): the learner computes in float32"
            )
        elif lcfg.bf16 == "on" and not native:
            bf16 = True  # a GPU without native bf16 still runs it; the user asked for it
        return cls(device, bf16, lcfg.sdpa_backend, fp16)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype matmuls run in inside :meth:`autocast`."""
        if self.fp16:
            return torch.float16
        return torch.bfloat16 if self.bf16 else torch.float32

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16 / fp16 autocast on this device when on, else nothing (float32)."""
        if not (self.bf16 or self.fp16):
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.compute_dtype)

    @contextlib.contextmanager
    def casts_once(self) -> Iterator[None]:
        """One optimizer update's micro-batches: autocast casts each float32 weight to the
        compute dtype once, not once per micro-batch.

        Autocast keeps its casts of trainable weights until the outermost autocast region
        ends; this opens that region (with autocast itself off inside it: only
        :meth:`autocast`, around each forward, turns it on), so the micro-batches of one
        update share the casts. End it before ``optimizer.step()``: the weights change."""
        if not (self.bf16 or self.fp16):
            yield
            return
        kind = self.device.type
        with (
            torch.autocast(kind, dtype=self.compute_dtype),
            torch.autocast(kind, enabled=False),
            cast_once(),  # the LM head's explicit cast in the chunked log-prob passes
        ):
            yield

    def grad_scaler(self) -> torch.amp.GradScaler:
        """The loss scaler of fp16 training on this device; a disabled (pass-through) one
        otherwise. It scales the loss before backward, unscales before clipping, skips the
        optimizer step when a gradient overflowed and lowers the scale then (raises it
        again after 2,000 clean steps)."""
        return torch.amp.GradScaler(self.device.type, enabled=self.fp16)

    def attention(self, length: int) -> contextlib.AbstractContextManager[Any]:
        """The scaled-dot-product attention kernel for a micro-batch of `length` tokens."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        choice = self.sdpa_backend
        if choice == "auto":
            short = self.device.type == "cpu" and length <= MATH_ATTENTION_MAX_TOKENS
            choice = "math" if short else "torch"
        if choice == "torch":
            return contextlib.nullcontext()
        backend = SDPBackend.MATH if choice == "math" else SDPBackend.FLASH_ATTENTION
        return sdpa_kernel(backend)


def same_attention_kernel() -> tuple[
    contextlib.AbstractContextManager[Any], contextlib.AbstractContextManager[Any]
]:
    """``context_fn`` for ``torch.utils.checkpoint``: the recompute of a checkpointed layer
    in backward runs under the attention kernels its forward had (:meth:`Precision.attention`
    is left by then). Other kernels save other tensors, which checkpointing refuses."""
    from torch.nn.attention import _cur_sdpa_kernel_backends, sdpa_kernel

    return contextlib.nullcontext(), sdpa_kernel(_cur_sdpa_kernel_backends())
