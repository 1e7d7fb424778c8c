"""The Tinker SDK's built-in losses on one datum's token log-probs (sums, as Tinker defines them).

    cross_entropy        -sum(weights * logp(target))
    importance_sampling  -sum(exp(logp - sampler_logp) * advantages)
    ppo                  -sum(min(r * A, clip(r, low, high) * A)),  r = exp(logp - sampler_logp)
    cispo                -sum(stopgrad(clip(r, low, high)) * logp * A)

``low``/``high`` come from ``loss_fn_config`` (``clip_low_threshold``, ``clip_high_threshold``;
0.8 and 1.2 when absent). Anything else, ``custom`` included, is refused by :func:`check`
before the request is queued. A client-side ``forward_backward_custom`` needs no server
support: the SDK runs ``forward`` and sends the gradient back as cross_entropy weights.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from agentrl.run.tinker.wire import Datum

# loss -> the loss_fn_inputs it needs besides target_tokens
REQUIRED: dict[str, tuple[str, ...]] = {
    "cross_entropy": (),
    "importance_sampling": ("logprobs", "advantages"),
    "ppo": ("logprobs", "advantages"),
    "cispo": ("logprobs", "advantages"),
}


class LossError(ValueError):
    """A loss the server does not run, or inputs that do not fit it."""


def check(loss_fn: str, data: list[Datum], config: dict[str, float | str]) -> None:
    """Refuse an unknown loss or missing / misshapen inputs, naming the field."""
    if loss_fn not in REQUIRED:
        hint = (
            " (server-side custom losses are not supported: call forward_backward_custom "
            "with a Python function, which the SDK runs on the client)"
            if loss_fn == "custom"
            else ""
        )
        raise LossError(
            f"loss_fn {loss_fn!r} is not supported by this server; supported: "
            f"{', '.join(REQUIRED)}{hint}"
        )
    for key, value in config.items():
        if key not in ("clip_low_threshold", "clip_high_threshold") or isinstance(value, str):
            raise LossError(
                f"loss_fn_config[{key!r}] is not understood by {loss_fn}; it takes "
                "clip_low_threshold and clip_high_threshold (numbers)"
            )
    if not data:
        raise LossError("forward_backward: data is empty")
    for i, d in enumerate(data):
        if not d.tokens:
            raise LossError(f"data[{i}].model_input is empty")
        target = d.inputs.get("target_tokens")
        if target is None:
            raise LossError(f"data[{i}].loss_fn_inputs has no target_tokens ({loss_fn} needs it)")
        if target.shape[0] != len(d.tokens):
            raise LossError(
                f"data[{i}].loss_fn_inputs['target_tokens'] has {target.shape[0]} positions "
                f"but model_input has {len(d.tokens)} tokens: they must match"
            )
        for name in ("weights", *REQUIRED[loss_fn]):
            if name not in d.inputs:
                if name == "weights":
                    continue
                raise LossError(f"data[{i}].loss_fn_inputs has no {name!r} ({loss_fn} needs it)")
            if d.inputs[name].shape != target.shape:
                raise LossError(
                    f"data[{i}].loss_fn_inputs[{name!r}] has shape {list(d.inputs[name].shape)}, "
                    f"target_tokens {list(target.shape)}: they must match"
                )


def _clip(config: dict[str, float | str]) -> tuple[float, float]:
    return float(config.get("clip_low_threshold", 0.8)), float(
        config.get("clip_high_threshold", 1.2)
    )


def _as(d: Datum, name: str, like: Tensor) -> Tensor:
    return torch.as_tensor(np.asarray(d.inputs[name], dtype=np.float32), device=like.device)


def _cross_entropy(logp: Tensor, d: Datum, config: dict[str, float | str]) -> Tensor:
    weights = _as(d, "weights", logp) if "weights" in d.inputs else torch.ones_like(logp)
    return -(weights * logp)


def _importance_sampling(logp: Tensor, d: Datum, config: dict[str, float | str]) -> Tensor:
    ratio = torch.exp(logp - _as(d, "logprobs", logp))
    return -(ratio * _as(d, "advantages", logp))


def _ppo(logp: Tensor, d: Datum, config: dict[str, float | str]) -> Tensor:
    low, high = _clip(config)
    adv = _as(d, "advantages", logp)
    ratio = torch.exp(logp - _as(d, "logprobs", logp))
    return -torch.minimum(ratio * adv, ratio.clamp(low, high) * adv)


def _cispo(logp: Tensor, d: Datum, config: dict[str, float | str]) -> Tensor:
    low, high = _clip(config)
    ratio = torch.exp(logp - _as(d, "logprobs", logp)).clamp(low, high).detach()
    return -(ratio * logp * _as(d, "advantages", logp))


LOSSES: dict[str, Callable[[Tensor, Datum, dict[str, float | str]], Tensor]] = {
    "cross_entropy": _cross_entropy,
    "importance_sampling": _importance_sampling,
    "ppo": _ppo,
    "cispo": _cispo,
}


def elementwise(loss_fn: str, logp: Tensor, d: Datum, config: dict[str, float | str]) -> Tensor:
    """The per-token loss of one datum (same shape as its target_tokens)."""
    return LOSSES[loss_fn](logp, d, config)
