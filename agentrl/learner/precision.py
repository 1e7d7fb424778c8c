"""Where and in what precision the learner computes: device, bf16 autocast, attention kernel.

Master weights stay float32; bf16 is used only inside autocast, and only where the device
computes it natively (or where ``learner.bf16=on`` asks for it).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from agentrl.config import LearnerConfig

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

    @classmethod
    def from_config(cls, lcfg: LearnerConfig) -> Precision:
        device = resolve_device(lcfg.device)
        bf16 = lcfg.bf16 == "on" or (lcfg.bf16 == "auto" and bf16_supported(device))
        return cls(device, bf16, lcfg.sdpa_backend)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16 autocast when on, else nothing (float32)."""
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

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
