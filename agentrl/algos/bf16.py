"""bf16 autocast matmuls as float32 GEMMs on bf16-rounded operands (``learner.bf16_matmul``).

Under CPU autocast a bf16 matmul rounds its operands to bf16, multiplies them with float32
accumulation and rounds the product to bf16. A CPU without bf16 instructions (no AVX-512
BF16, no AMX) has no fast kernel for that: torch runs it in a generic loop, 7x slower than
its float32 GEMM at a learner's shapes (576 x 1536 x 800 on a Zen 3 core: 98 vs 13 ms), and
a SmolLM2 learner step spends 98% of its time there. The same arithmetic runs at float32
speed as: round the operands to bf16, widen them back (exact), multiply in float32 (float32
accumulation), round the product to bf16. Only the order of the float32 additions differs
from the generic kernel, as it differs between any two GEMM kernels: nearly every element
of a product is identical, the rest a bf16 step or two apart (``tests/algos/test_bf16.py``).

:func:`rounded_matmuls` applies it inside an enabled CPU bf16 autocast region: ``F.linear``
(forward and backward, :class:`RoundedLinear`: gradients rounded to bf16 as autocast's
would be) and, where no gradient is recorded, ``mm`` / ``matmul`` / ``bmm``. Anything
autocast would not run in bf16 (autocast off, another dtype, a GPU tensor) is left to
torch. The LM head's fused log-prob function asks :func:`active` and rounds its own
matmuls (:mod:`agentrl.algos.logprobs`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

BF16 = torch.bfloat16
_FLOATS = (torch.float32, torch.bfloat16)
_state = threading.local()


def round_(t: Tensor) -> Tensor:
    """Round a float32 tensor to the nearest bf16 value in place (ties to even, as
    ``.to(torch.bfloat16)``); returns `t`."""
    return t.copy_(t.to(BF16))


def widened(t: Tensor) -> Tensor:
    """`t` rounded to bf16 and widened back to float32 (exact): a GEMM operand."""
    return t.to(BF16).float()


# rows of a [V, H] weight widened at a time by the sliced products below: the LM head's
# 49,152 x 576 weight would be a 113 MB float32 copy, a slice of 8,192 rows is 19 MB
WEIGHT_SLICE = 8192


def linear_into(x: Tensor, w: Tensor, out: Tensor) -> Tensor:
    """``out[n, V] = bf16(x @ w^T)`` for a large ``w [V, H]``, widened a slice of rows at a
    time; `out` in bf16 (or float32, holding bf16 values). Returns `out`."""
    xw = widened(x)
    for v0 in range(0, w.shape[0], WEIGHT_SLICE):
        part = slice(v0, v0 + WEIGHT_SLICE)
        out[:, part] = torch.mm(xw, widened(w[part]).t()).to(BF16)
    return out


def matmul(a: Tensor, w: Tensor) -> Tensor:
    """``bf16(a @ w)`` for ``a [n, V]``, ``w [V, H]``: the float32 sum over slices of V."""
    acc: Tensor | None = None
    for v0 in range(0, w.shape[0], WEIGHT_SLICE):
        part = slice(v0, v0 + WEIGHT_SLICE)
        p = torch.mm(widened(a[:, part]), widened(w[part]))
        acc = p if acc is None else acc.add_(p)
    assert acc is not None, "matmul: empty weight"
    return acc.to(BF16)


def addmm_t_(acc: Tensor, a: Tensor, h: Tensor) -> Tensor:
    """``acc[V, H] += a^T @ h`` in float32 on bf16-rounded ``a [n, V]`` and ``h [n, H]``
    (not rounded: round `acc` once its sum is complete). Returns `acc`."""
    hw = widened(h)
    for v0 in range(0, acc.shape[0], WEIGHT_SLICE):
        part = slice(v0, v0 + WEIGHT_SLICE)
        acc[part].addmm_(widened(a[:, part]).t(), hw)
    return acc


def active(device_type: str = "cpu") -> bool:
    """Whether matmuls on `device_type` run rounded here: inside :func:`rounded_matmuls`,
    with bf16 autocast enabled on that device."""
    return (
        getattr(_state, "depth", 0) > 0
        and device_type == "cpu"
        and torch.is_autocast_enabled("cpu")
        and torch.get_autocast_dtype("cpu") == BF16
    )


def _applies(*tensors: Any) -> bool:
    return (
        all(
            isinstance(t, Tensor) and t.dtype in _FLOATS and t.device.type == "cpu" for t in tensors
        )
        and active()
    )


class RoundedLinear(torch.autograd.Function):
    """``F.linear(x, w, b)`` as CPU bf16 autocast computes it, on float32 GEMMs.

    Forward: bf16 ``x @ w^T + b``. Backward: ``dx`` and ``dw`` are bf16 products rounded to
    bf16 and returned in the input's own dtype (a float32 master weight gets a float32
    gradient holding a bf16 value, as autocast's cast would give it). Saves `x` in bf16
    (`xb`, ``x`` rounded, when given: projections of one input share it) and the weight
    itself (no bf16 copy of it is kept: it is rounded again in backward).
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: Tensor, w: Tensor, b: Tensor | None, xb: Tensor | None = None
    ) -> Tensor:
        xb = x.detach().to(BF16) if xb is None else xb
        with torch.autocast("cpu", enabled=False):
            out = F.linear(xb.float(), widened(w), None if b is None else widened(b)).to(BF16)
        ctx.save_for_backward(xb, w)
        ctx.x_dtype, ctx.b_dtype = x.dtype, None if b is None else b.dtype
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        xb, w = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        with torch.autocast("cpu", enabled=False):
            g = widened(grad)
            gx = gw = gb = None
            if need_x:
                gx = g.matmul(widened(w)).to(BF16).to(ctx.x_dtype)
            g2 = g.reshape(-1, g.shape[-1])
            if need_w:
                gw = g2.t().mm(xb.reshape(-1, xb.shape[-1]).float()).to(BF16).to(w.dtype)
            if need_b:
                gb = g2.sum(0).to(BF16).to(ctx.b_dtype)
        return gx, gw, gb, None


def _rounded_product(func: Callable[..., Tensor], a: Tensor, b: Tensor) -> Tensor:
    with torch.autocast("cpu", enabled=False):
        return func(widened(a), widened(b)).to(BF16)


_PRODUCTS = {torch.mm, torch.matmul, torch.bmm, Tensor.mm, Tensor.matmul, Tensor.bmm}
_PRODUCTS |= {Tensor.__matmul__}


class _RoundedMatmuls(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        # the last linear input rounded: q/k/v (and gate/up) read one input, and each bf16
        # copy of it is kept for backward (autocast makes one per projection: 3 + 2 copies
        # of a layer's input, ~200 MB for a SmolLM2 micro-batch of 16 x 120 tokens)
        self._last: tuple[Tensor, int, Tensor] | None = None

    def _rounded_input(self, x: Tensor) -> Tensor:
        if x.is_inference():  # no version counter to tell an in-place change (and no backward)
            return x.detach().to(BF16)
        last = self._last
        if last is not None and last[0] is x and last[1] == x._version:
            return last[2]
        xb = x.detach().to(BF16)
        self._last = (x, x._version, xb)
        return xb

    def __exit__(self, *exc: Any) -> None:
        self._last = None
        super().__exit__(*exc)

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is F.linear and not kwargs and 2 <= len(args) <= 3:
            x, w, b = (*args, None)[:3]
            if _applies(x, w) and (b is None or _applies(b)):
                return RoundedLinear.apply(x, w, b, self._rounded_input(x))
        elif func in _PRODUCTS and not kwargs and len(args) == 2:
            a, b = args
            if _applies(a, b) and not (
                torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)
            ):
                return _rounded_product(func, a, b)
        return func(*args, **kwargs)


@contextlib.contextmanager
def rounded_matmuls() -> Iterator[None]:
    """Run the bf16 matmuls of an enabled CPU bf16 autocast region as float32 GEMMs on
    bf16-rounded operands (see the module docstring). Nests; outside autocast it changes
    nothing."""
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        with _RoundedMatmuls():
            yield
    finally:
        _state.depth -= 1


@contextlib.contextmanager
def cpu_autocast(rounded: bool) -> Iterator[None]:
    """CPU bf16 autocast; its matmuls run as :func:`rounded_matmuls` when `rounded` (a CPU
    without bf16 instructions), else on torch's bf16 kernels."""
    with (
        torch.autocast("cpu", dtype=BF16),
        rounded_matmuls() if rounded else contextlib.nullcontext(),
    ):
        yield
