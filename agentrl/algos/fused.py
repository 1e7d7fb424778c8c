"""Compiled element-wise passes of the LM-head log-prob kernel (``torch.compile``, CPU).

:class:`~agentrl.algos.logprobs._LinearLogprobEntropy` spends most of its CPU time not in
the two matmuls but in the element-wise passes over each ``[chunk, V]`` block of logits:
max, scale and shift, clamp, exp, the two sums, and in backward the rebuilt softmax and its
gradient. Eagerly every pass is its own sweep over the block and its own ``exp``; compiled
(inductor's C++ backend) they fuse into one or two vectorised loops over each row
(``benchmarks/learner_step.py`` compares ``learner.fused_logprobs`` on and off).

The compiled kernels compute exactly what the eager passes do (same shift, same exp floor,
same float32 arithmetic, up to summation order), see ``tests/algos/test_fused.py``.

Availability: ``auto`` uses them on CPU for float32 compute when ``torch.compile`` works
here (it needs a C++ compiler); the first failure logs one warning and the eager passes
take over for the rest of the process. The first call compiles (~15 s on 2 cores, cached
on disk by inductor for later processes). CUDA keeps the eager passes: the Triton path has
never been run in this project.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor

log = logging.getLogger(__name__)

Fused = Literal["auto", "on", "off"]
FUSED_MODES = ("auto", "on", "off")

# exp of anything below this is 0 in the normaliser: x86's exp takes a ~7x slower path when
# its result is subnormal, and e^-80 is ~1e-35 of the row's largest term
EXP_FLOOR = -80.0
RECOMPILE_LIMIT = 64  # compiled variants kept per kernel (dynamo's default: 8)

_lock = threading.Lock()
_broken: str | None = None  # why compiling failed in this process, once it has
_compiled: dict[str, Callable[..., Any]] = {}


def _forward(
    z: Tensor, labels: Tensor, inv_t: Tensor, with_entropy: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """Logits ``z [n, V]`` (any float dtype) -> float32 (log-prob of `labels`, entropy,
    log-normaliser), each ``[n]``, of ``softmax(z * inv_t)``."""
    y = z.float() * inv_t
    shift = y.amax(dim=-1, keepdim=True)
    y = y - shift
    picked = y.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    y = y.clamp(min=EXP_FLOOR)
    p = y.exp()
    total = p.sum(dim=-1)
    log_total = total.log()
    ent = log_total - (p * y).sum(dim=-1) / total if with_entropy else torch.zeros_like(total)
    return picked - log_total, ent, shift.squeeze(-1) + log_total


def _backward(
    z: Tensor,
    labels: Tensor,
    lse: Tensor,
    a: Tensor | None,
    b: Tensor,
    hot: Tensor,
    inv_t: Tensor,
    out_dtype: torch.dtype,
) -> Tensor:
    """``dL/dz [n, V]`` in `out_dtype`: ``p * (a * log p + b) + onehot(labels) * hot``,
    with ``log p = z * inv_t - lse`` floored at :data:`EXP_FLOOR`."""
    logp = (z.float() * inv_t - lse.unsqueeze(-1)).clamp(min=EXP_FLOOR)
    p = logp.exp()
    # the same expression as the eager backward; `a` is None when entropy has no gradient
    grad = p * b.unsqueeze(-1) if a is None else p * (a.unsqueeze(-1) * logp + b.unsqueeze(-1))
    vocab = torch.arange(z.shape[-1], device=z.device)
    grad = grad + torch.where(vocab == labels.unsqueeze(-1), hot.unsqueeze(-1), 0.0)
    return grad.to(out_dtype)


def check_mode(mode: str) -> None:
    if mode not in FUSED_MODES:
        raise ValueError(f"fused must be one of {', '.join(FUSED_MODES)} (got {mode!r})")


def wanted(mode: Fused, device: torch.device, compute_dtype: torch.dtype) -> bool:
    """Whether the compiled passes should run for this call."""
    check_mode(mode)
    if mode == "off" or compute_dtype != torch.float32:
        return False
    if mode == "on":
        return True
    return device.type == "cpu" and _broken is None


def _get(name: str) -> Callable[..., Any]:
    with _lock:
        fn = _compiled.get(name)
        if fn is None:
            target = _forward if name == "forward" else _backward
            fn = torch.compile(target, dynamic=True, fullgraph=True)
            _compiled[name] = fn
        return fn


def call(name: str, mode: Fused, *args: Any) -> Any:
    """Run compiled kernel `name` ("forward" or "backward"); ``None`` when it cannot run
    in ``auto`` mode (the caller takes the eager path). In ``on`` mode a failure raises."""
    global _broken
    try:
        # each variant (entropy or not, logits dtype, entropy gradient or not, output dtype)
        # is one compiled graph: a process that meets them all (a test run, a server of
        # several models) must not hit dynamo's default limit of 8 per function
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
            return _get(name)(*args)
    except Exception as e:
        if mode == "on":
            raise RuntimeError(
                f"learner.fused_logprobs=on, but the compiled log-prob kernel failed: "
                f"{type(e).__name__}: {e}. Set learner.fused_logprobs=auto (falls back to "
                "the eager passes) or off"
            ) from e
        with _lock:
            if _broken is None:
                _broken = f"{type(e).__name__}: {e}"
                log.warning(
                    "compiled log-prob kernel unavailable (%s); using the eager passes "
                    "(learner.fused_logprobs=off silences this)",
                    _broken.splitlines()[0][:300],
                )
        return None
