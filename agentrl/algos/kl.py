"""KL estimators (Schulman, "Approximating KL divergence", 2020), per token ``[B, T]``.

Samples come from the policy; ``log r = ref_logprobs - logprobs`` (r = pi_ref / pi_theta).
The log ratio is clamped to [-20, 20] before exponentiation to stay finite.
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentrl.algos.registry import KL_ESTIMATORS, register_kl
from agentrl.algos.stats import LOG_RATIO_CLAMP as _LOG_RATIO_CLAMP


# k1 = -log r: unbiased, high variance, can be negative
@register_kl("k1")
def k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return logprobs - ref_logprobs


# k2 = (log r)^2 / 2: biased, low variance, its gradient is the gradient of KL
@register_kl("k2")
def k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return 0.5 * (logprobs - ref_logprobs) ** 2


# k3 = r - log r - 1: unbiased, >= 0, low variance (GRPO eq. 4)
@register_kl("k3")
def k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    log_r = (ref_logprobs - logprobs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    # expm1 avoids cancellation near r = 1; the clamp removes rounding below 0
    return (torch.expm1(log_r) - log_r).clamp(min=0.0)


# k3+: the value of k3 with the gradient of k2 (straight-through)
@register_kl("k3+")
def k3_plus(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    grad_part = k2(logprobs, ref_logprobs)
    return grad_part + (k3(logprobs, ref_logprobs) - grad_part).detach()


def kl_divergence(name: str, logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token KL estimate ``[B, T]`` of pi_theta against pi_ref by estimator ``name``."""
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            "logprobs and ref_logprobs must have the same shape "
            f"(got {tuple(logprobs.shape)} and {tuple(ref_logprobs.shape)})"
        )
    return KL_ESTIMATORS.get(name)(logprobs, ref_logprobs)
