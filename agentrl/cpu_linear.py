"""Float32 linear layers on a CPU through oneDNN (``model.cpu_linear``).

torch's x86 CPU wheels run a float32 ``nn.Linear`` through MKL's sgemm. On the AMD EPYC
machines this project runs on, MKL took 2.2-2.9x as long as oneDNN for the same products.
oneDNN is the other GEMM library inside torch, reached through ``torch.ops.mkldnn``.
Measured on a 2-core EPYC with AVX-512 (docs/performance.md, "Issue 51, third session"):

- decode, 16 rows x 576 -> 1536: 227 vs 77 us
- the learner, 1120 x 576 -> 1536: 8.8 vs 4.0 ms
- the LM head, 16 x 576 -> 49152: 11.6 vs 3.2 ms

It also pays with oneDNN held to AVX2. The same float32 arithmetic, in another order, so
results differ only in float rounding. bf16 and float16 matmuls already go through oneDNN
in torch, so only float32 is rerouted.

    kernel = route_linears(model, "auto")   # "onednn" or "torch"

``route_linears`` swaps the class of every plain ``nn.Linear`` in the model (the LM head
included) for :class:`CpuLinear`, a subclass whose ``forward`` calls oneDNN. Names,
``state_dict``, ``isinstance`` checks, peft's wrappers and deep copies are unchanged.
Each call falls back to ``F.linear`` unless all of these hold:

- CPU tensors in float32;
- autocast off;
- plain weights (not a torchao quantized tensor);
- not traced by ``torch.compile``.

So one model can serve bf16 autocast, a quantized sampler or a compiled learner unchanged.
``auto`` times both libraries once per process on the model's most common linear shape,
at the rows of the caller's hot path: 16 for a sampler's decode step, 512 for a learner's
micro-batch. It picks oneDNN only when that is at least 10% faster there. On an Intel CPU,
where MKL is at home, it may keep torch's default. With every library held to AVX2 on the
machine above, oneDNN with plain weights was about level with MKL (0.97-1.17x) but for
the LM head (1.76x): ``auto`` then decides by the timing (``benchmarks/cpu_gemm.py``).
"""

from __future__ import annotations

import collections
import functools
import logging
import time
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F

from agentrl.errors import ConfigError

log = logging.getLogger(__name__)

CpuLinearMode = Literal["auto", "onednn", "torch"]
MODES: tuple[str, ...] = get_args(CpuLinearMode)
_KEY = "model.cpu_linear"
# auto picks oneDNN when it takes at most this share of torch's time at every size timed
AUTO_MARGIN = 0.9
# auto leaves layers narrower than this on torch's path untimed: both libraries spend their
# time in call overhead there, and a timing of microseconds picks one by noise (tiny test
# models: 64 -> 64 timed 0.88 once, 1.9 another time)
AUTO_MIN_FEATURES = 256
DECODE_ROWS = (16,)  # a sampler's decode step
TRAIN_ROWS = (512,)  # a learner micro-batch's tokens


def available() -> bool:
    """Whether this torch has oneDNN's linear op (x86 and aarch64 wheels do)."""
    return bool(
        torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T + bias`` for a 2-D `x` by oneDNN (any strides)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def matmul_t(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b.T`` of 2-D float32 CPU tensors (any strides) by oneDNN, for callers that
    run the products of a routed layer themselves (the learner's chunked LM head)."""
    return _onednn(a, b, None)


class _OneDNNLinear(torch.autograd.Function):
    """``F.linear`` with oneDNN products forward and backward:
    ``y = x W^T + b``, ``dx = dy W``, ``dW = dy^T x``, ``db = sum(dy)``."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(x2, weight)
        ctx.x_shape = x.shape
        ctx.has_bias = bias is not None
        return _onednn(x2, weight, bias).view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        x2, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])
        need_x, need_w, need_b = ctx.needs_input_grad
        gx = _onednn(g2, weight.t(), None).view(ctx.x_shape) if need_x else None
        gw = _onednn(g2.t(), x2.t(), None) if need_w else None
        gb = g2.sum(0) if need_b and ctx.has_bias else None
        return gx, gw, gb


def _routable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and type(weight) in (torch.Tensor, torch.nn.Parameter)
        and x.dim() >= 1
        and x.numel() > 0
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, by oneDNN where :func:`_routable` says it may be."""
    if _routable(x, weight):
        return _OneDNNLinear.apply(x, weight, bias)
    return F.linear(x, weight, bias)


class CpuLinear(torch.nn.Linear):
    """``nn.Linear`` whose float32 CPU forward runs on oneDNN (see the module docstring)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return linear(input, self.weight, self.bias)


def _seconds(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@functools.cache
def measure(
    in_features: int, out_features: int, threads: int, rows: tuple[int, ...] = TRAIN_ROWS
) -> dict[int, float]:
    """oneDNN's time over torch's default for a float32 ``[rows, in] x [in, out]`` linear,
    per row count in `rows` (best of 5 interleaved rounds, after a warm-up; below 1: oneDNN
    is faster). `threads` keys the cache: the answer depends on it."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(out_features, in_features, generator=gen)
    ratios = {}
    with torch.no_grad():
        for n in rows:
            x = torch.randn(n, in_features, generator=gen)
            calls = max(1, 4096 // n)  # ~the same work per timing at any size

            def ours(x: torch.Tensor = x, calls: int = calls) -> None:
                for _ in range(calls):
                    _onednn(x, weight, None)

            def theirs(x: torch.Tensor = x, calls: int = calls) -> None:
                for _ in range(calls):
                    F.linear(x, weight)

            ours(), theirs()  # warm-up: oneDNN builds its kernel on first use
            t_ours = t_theirs = float("inf")
            for _ in range(5):  # interleaved: a burst of load hits both
                t_ours = min(t_ours, _seconds(ours))
                t_theirs = min(t_theirs, _seconds(theirs))
            ratios[n] = t_ours / t_theirs
    return ratios


def _common_shape(model: torch.nn.Module) -> tuple[int, int] | None:
    shapes = collections.Counter(
        (m.in_features, m.out_features) for m in model.modules() if type(m) is torch.nn.Linear
    )
    return shapes.most_common(1)[0][0] if shapes else None


def check_mode(mode: str) -> str:
    """`mode` if it is one of :data:`MODES`, else a ConfigError naming the key."""
    if mode not in MODES:
        raise ConfigError(f"{_KEY} must be one of {', '.join(MODES)} (got {mode!r})")
    return mode


def choose(
    model: torch.nn.Module, mode: str, rows: tuple[int, ...] = TRAIN_ROWS
) -> tuple[str, str]:
    """(``onednn`` | ``torch``, why) for `model` under `mode`; ``auto`` times `rows`."""
    check_mode(mode)
    if mode == "torch":
        return "torch", f"{_KEY}=torch"
    if not available():
        if mode == "onednn":
            raise ConfigError(
                f"{_KEY}=onednn, but this torch build has no oneDNN linear op "
                f"(torch.ops.mkldnn._linear_pointwise); set {_KEY}: auto or torch"
            )
        return "torch", "this torch has no oneDNN linear op"
    if mode == "onednn":
        return "onednn", f"{_KEY}=onednn"
    shape = _common_shape(model)
    if shape is None:
        return "torch", "no nn.Linear layers"
    if min(shape) < AUTO_MIN_FEATURES:
        return "torch", f"linear {shape[0]}->{shape[1]}: too narrow to time the libraries apart"
    ratios = measure(*shape, torch.get_num_threads(), tuple(rows))
    timed = ", ".join(f"{1 / r:.2f}x at {n} rows" for n, r in ratios.items())
    why = f"oneDNN vs torch's float32 linear {shape[0]}->{shape[1]} on this CPU: {timed}"
    if all(r <= AUTO_MARGIN for r in ratios.values()):
        return "onednn", why
    return "torch", why


def route_linears(
    model: torch.nn.Module, mode: str = "auto", rows: tuple[int, ...] = TRAIN_ROWS
) -> str:
    """Run `model`'s float32 CPU linear layers through oneDNN when `mode` (``auto`` |
    ``onednn`` | ``torch``) says so; returns the kernel chosen. ``auto`` times both at
    `rows` (:data:`DECODE_ROWS` for a sampler, :data:`TRAIN_ROWS` for a learner). Only CPU
    models are considered (a model on a GPU is left as it is and ``torch`` returned); only
    layers whose class is exactly ``nn.Linear`` are swapped."""
    params = next(model.parameters(), None)
    if params is None or params.device.type != "cpu":
        return "torch"
    kernel, why = choose(model, mode, rows)
    if kernel == "onednn":
        for module in model.modules():
            if type(module) is torch.nn.Linear:
                module.__class__ = CpuLinear
    log.info("float32 CPU linear layers: %s (%s)", kernel, why)
    return kernel


def unroute_linears(model: torch.nn.Module) -> None:
    """Put every :class:`CpuLinear` of `model` back to ``nn.Linear``."""
    for module in model.modules():
        if type(module) is CpuLinear:
            module.__class__ = torch.nn.Linear
