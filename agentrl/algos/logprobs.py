"""Token log-probs and entropy without materialising a whole ``[B, T, V]`` float32 tensor.

Work is split into chunks of ``chunk`` tokens over the flattened ``B*T`` positions; each
chunk is upcast to float32 (float64 inputs stay float64), scaled, reduced to ``[chunk]`` and dropped. Backward is chunked
too, so only one chunk's ``[chunk, V]`` exists at a time in either direction:

* from logits: every chunk runs under ``torch.utils.checkpoint`` (recomputed in backward);
* from hidden states (:func:`chunked_logprobs_entropy`, what the learner uses): a custom
  autograd function keeps only the inputs plus the per-token log-normaliser and entropy,
  and in backward rebuilds each chunk's softmax from them and applies the closed-form
  gradients ``dlogp_y/dz = onehot(y) - p`` and ``dH/dz = -p (log p + H)``
  (one extra ``hidden @ W.T`` per chunk; no double backward).

Temperature convention: the distribution is ``softmax(logits / temperature)``, the one the
sampler drew from; ``temperature == 0`` (greedy decoding) is treated as 1.

Alignment: these functions score ``labels`` with the logits *at the same position*; the
caller shifts (``logits[:, :-1]`` with ``input_ids[:, 1:]``), or uses
:func:`sequence_logprobs_entropy`, which follows the ``agentrl.types`` convention.
Labels < 0 (e.g. -100 padding) get log-prob 0 and entropy 0.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from agentrl.algos import fused as fused_kernels
from agentrl.algos.fused import Fused
from agentrl.cpu_linear import matmul_t

# (data_ptr, version, dtype) -> the weight cast to dtype, while a cast_once() region is open
_casts: dict[tuple[int, int, torch.dtype], Tensor] | None = None
_casts_lock = threading.Lock()


@contextlib.contextmanager
def cast_once() -> Iterator[None]:
    """While open, the LM head weight's cast to the matmul dtype is made once and reused
    by every forward and backward of :func:`chunked_logprobs_entropy` (an optimizer
    update's micro-batches: ``Precision.casts_once``). A weight changed in place (a new
    version) is cast again. Process-wide, not per thread: CUDA runs backward on a thread
    of its own."""
    global _casts
    with _casts_lock:
        outer = _casts is None
        if outer:
            _casts = {}
    try:
        yield
    finally:
        if outer:
            with _casts_lock:
                _casts = None


def _cast(weight: Tensor, dtype: torch.dtype) -> Tensor:
    if weight.dtype == dtype:
        return weight
    casts = _casts
    if casts is None:
        return weight.to(dtype)
    key = (weight.data_ptr(), weight._version, dtype)
    with _casts_lock:
        hit = casts.get(key)
    if hit is None:
        hit = weight.detach().to(dtype)
        with _casts_lock:
            casts[key] = hit
    return hit


def _compute_dtype(x: Tensor) -> torch.dtype:
    """float32, or float64 when the inputs are float64 (for gradient checks)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _inv_temperature(temperature: float) -> float:
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (got {temperature})")
    return 1.0 if temperature == 0 else 1.0 / temperature


def _score(z: Tensor, labels: Tensor, with_logprobs: bool, with_entropy: bool) -> Tensor:
    """Scaled float32 logits ``[n, V]`` -> stacked ``[k, n]`` (logprob and/or entropy)."""
    lse = torch.logsumexp(z, dim=-1)
    outs = []
    valid = labels >= 0
    if with_logprobs:
        picked = z.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        outs.append(torch.where(valid, picked - lse, torch.zeros_like(lse)))
    if with_entropy:
        p = torch.softmax(z, dim=-1)
        ent = lse - (p * z).sum(dim=-1)
        outs.append(torch.where(valid, ent, torch.zeros_like(ent)))
    return torch.stack(outs)


def _from_logits_chunk(
    logits: Tensor, labels: Tensor, inv_t: float, with_logprobs: bool, with_entropy: bool
) -> Tensor:
    return _score(logits.to(_compute_dtype(logits)) * inv_t, labels, with_logprobs, with_entropy)


def _run_chunks(
    fn: Callable[..., Tensor],
    chunked: list[Tensor],
    shared: list[Tensor],
    chunk: int,
    *extra: object,
) -> Tensor:
    """``fn(*row_chunks, *shared, *extra)`` over row-chunks of ``chunked``; concat on dim 1."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1 (got {chunk})")
    rows = chunked[0].shape[0]
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in chunked + shared)
    pieces = []
    for start in range(0, rows, chunk):
        args = [t[start : start + chunk] for t in chunked] + shared
        if needs_grad:
            pieces.append(checkpoint(fn, *args, *extra, use_reentrant=False))
        else:
            pieces.append(fn(*args, *extra))
    return torch.cat(pieces, dim=1)


def _check_labels(leading: torch.Size, labels: Tensor, what: str) -> None:
    if labels.shape != leading:
        raise ValueError(
            f"labels must have the shape of {what} without the last dim {tuple(leading)} "
            f"(got {tuple(labels.shape)})"
        )


def _logits_pass(
    logits: Tensor, labels: Tensor, temperature: float, chunk: int, lp: bool, ent: bool
) -> Tensor:
    _check_labels(logits.shape[:-1], labels, "logits")
    V = logits.shape[-1]
    flat = logits.reshape(-1, V)
    out = _run_chunks(
        _from_logits_chunk,
        [flat, labels.reshape(-1)],
        [],
        chunk,
        _inv_temperature(temperature),
        lp,
        ent,
    )
    return out.reshape(out.shape[0], *labels.shape)


def logprobs_from_logits(
    logits: Tensor, labels: Tensor, temperature: float = 1.0, chunk: int = 1024
) -> Tensor:
    """``log softmax(logits / temperature)[labels]`` -> float32 of ``labels``' shape."""
    return _logits_pass(logits, labels, temperature, chunk, True, False)[0]


def entropy_from_logits(
    logits: Tensor, temperature: float = 1.0, chunk: int = 1024, labels: Tensor | None = None
) -> Tensor:
    """Entropy of ``softmax(logits / temperature)`` per position -> float32 ``logits.shape[:-1]``.

    ``labels`` is only used to zero positions whose label is < 0.
    """
    if labels is None:
        labels = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
    return _logits_pass(logits, labels, temperature, chunk, False, True)[0]


# exp() of inputs below about -87 (results in float32's subnormal range) runs several times
# slower on x86; a logit this far below the row's max has probability < 1.8e-35, so clamping
# there changes normalisers and gradients by less than float32 can represent
_EXP_FLOOR = fused_kernels.EXP_FLOOR


def _matmul_dtype(hidden: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype autocast would run ``hidden @ weight.T`` in (the LM head's matmul)."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device) and weight.dtype == torch.float32:
        return torch.get_autocast_dtype(device)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _logits(hidden: Tensor, weight: Tensor, out: Tensor, onednn: bool) -> Tensor:
    """``hidden @ weight.T`` written into `out` (a workspace buffer reused every chunk)."""
    if onednn:
        return out.copy_(matmul_t(hidden, weight))
    return torch.mm(hidden, weight.t(), out=out)


class _LinearLogprobEntropy(torch.autograd.Function):
    """(hidden [N, H], weight [V, H], labels [N]) -> (logprob [N], entropy [N]), chunked.

    On a CPU the full ``[chunk, V]`` element-wise passes, not the matmuls, dominate for
    small hidden sizes, so each chunk makes as few as it can and writes into workspace
    buffers allocated once per call (a fresh 100 MB tensor per chunk costs page faults that
    took longer than the arithmetic). The LM-head matmuls run in the forward's autocast
    dtype in both directions, as autocast itself would.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        hidden: Tensor,
        weight: Tensor,
        labels: Tensor,
        inv_t: float,
        chunk: int,
        with_entropy: bool,
        fused: Fused,
        onednn: bool,
    ) -> tuple[Tensor, Tensor]:
        mm_dtype = _matmul_dtype(hidden, weight)
        # the products by oneDNN (model.cpu_linear) where they run in float32 on the CPU
        ctx.onednn = onednn and mm_dtype == torch.float32 and hidden.device.type == "cpu"
        # dtypes are chosen explicitly below; autocast would recast the [n, V] reductions
        with torch.autocast(hidden.device.type, enabled=False):
            return _LinearLogprobEntropy._forward(
                ctx, hidden, weight, labels, inv_t, chunk, with_entropy, mm_dtype, fused
            )

    @staticmethod
    def _forward(
        ctx: torch.autograd.function.FunctionCtx,
        hidden: Tensor,
        weight: Tensor,
        labels: Tensor,
        inv_t: float,
        chunk: int,
        with_entropy: bool,
        mm_dtype: torch.dtype,
        fused: Fused,
    ) -> tuple[Tensor, Tensor]:
        N, V = hidden.shape[0], weight.shape[0]
        dt = _compute_dtype(hidden)
        w = _cast(weight, mm_dtype)
        lp = torch.zeros(N, dtype=dt, device=hidden.device)
        ent = torch.zeros_like(lp)
        lse = torch.zeros_like(lp)
        valid = labels >= 0
        safe = labels.clamp(min=0)
        n0 = min(chunk, N)
        z_buf = torch.empty(n0, V, dtype=mm_dtype, device=hidden.device)
        compiled = fused_kernels.wanted(fused, hidden.device, dt)
        # the compiled passes take the temperature as a tensor (made only for them: a host
        # scalar copied to a CUDA device would synchronise)
        inv_t_t = torch.tensor(inv_t, dtype=dt, device=hidden.device) if compiled else None
        y_buf = e_buf = None  # the eager passes' workspace, made when first needed
        for s in range(0, N, chunk):
            e = min(s + chunk, N)
            n = e - s
            z = _logits(hidden[s:e].to(mm_dtype), w, z_buf[:n], ctx.onednn)  # type: ignore[attr-defined]
            if compiled:
                out = fused_kernels.call("forward", fused, z, safe[s:e], inv_t_t, with_entropy)
                if out is not None:
                    lp[s:e], ent[s:e], lse[s:e] = out
                    continue
                compiled = False
            if y_buf is None:
                y_buf = z_buf if mm_dtype == dt else torch.empty(n0, V, dtype=dt, device=z.device)
                e_buf = torch.empty_like(y_buf) if with_entropy else None
            shift = z.amax(dim=-1).to(dt).mul_(inv_t)  # inv_t > 0: max commutes with it
            y = y_buf[:n]
            if y is not z:
                y.copy_(z)
            if inv_t != 1.0:
                y.mul_(inv_t)
            y.sub_(shift[:, None])  # y = z / T - max <= 0
            picked = y.gather(-1, safe[s:e, None]).squeeze(-1)
            y.clamp_(min=_EXP_FLOOR)
            if e_buf is not None:
                p = torch.exp(y, out=e_buf[:n])
                total = p.sum(dim=-1)
                # H = log S - sum_v e^y_v y_v / S, the dot product without a [n, V] temporary
                dot = torch.bmm(p.unsqueeze(1), y.unsqueeze(2)).view(n)
                ent[s:e] = total.log() - dot / total
            else:
                total = y.exp_().sum(dim=-1)
            log_total = total.log()
            lse[s:e] = shift + log_total
            lp[s:e] = picked - log_total
        lp = torch.where(valid, lp, torch.zeros_like(lp))
        ent = torch.where(valid, ent, torch.zeros_like(ent))
        # one chunk through the compiled passes (which leave z as it was): its logits stay for
        # the backward instead of being recomputed, one [N, H] x [H, V] matmul less. The
        # backward would allocate the same buffer, so the peak does not grow.
        wants_grad = any(ctx.needs_input_grad[:2])  # type: ignore[attr-defined]
        ctx.logits = z_buf if compiled and chunk >= N and wants_grad else None
        ctx.save_for_backward(hidden, weight, labels, lse, ent)
        ctx.inv_t, ctx.chunk, ctx.with_entropy = inv_t, chunk, with_entropy
        ctx.mm_dtype, ctx.device_type, ctx.fused = mm_dtype, hidden.device.type, fused
        ctx.set_materialize_grads(False)  # an unused output (entropy) costs no backward work
        return lp, ent

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, g_lp: Tensor | None, g_ent: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        with torch.autocast(ctx.device_type, enabled=False):  # type: ignore[attr-defined]
            return _LinearLogprobEntropy._backward(ctx, g_lp, g_ent)

    @staticmethod
    def _backward(
        ctx: torch.autograd.function.FunctionCtx, g_lp: Tensor | None, g_ent: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        hidden, weight, labels, lse, ent = ctx.saved_tensors  # type: ignore[attr-defined]
        inv_t, chunk = ctx.inv_t, ctx.chunk  # type: ignore[attr-defined]
        mm_dtype: torch.dtype = ctx.mm_dtype  # type: ignore[attr-defined]
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]  # type: ignore[attr-defined]
        use_ent = ctx.with_entropy and g_ent is not None  # type: ignore[attr-defined]
        none = (None, None, None, None, None, None, None, None)
        onednn: bool = ctx.onednn  # type: ignore[attr-defined]
        if (g_lp is None and not use_ent) or not (need_h or need_w):
            return none
        N, V = hidden.shape[0], weight.shape[0]
        dt = lse.dtype
        valid = (labels >= 0).to(dt)
        # dL/dz = [g_lp * (onehot - p) - g_ent * p * (log p + H)] / T
        #       = p * (a * log p + b) + onehot * g_lp / T, with per-row scalars
        #   a = -g_ent / T,  b = -(g_lp + g_ent * H) / T
        g_lp = g_lp * valid if g_lp is not None else torch.zeros_like(lse)
        b = g_lp * -inv_t
        a = None
        if use_ent:
            a = g_ent * valid * -inv_t  # type: ignore[operator]
            b = b + a * ent
        hot = g_lp * inv_t
        w = _cast(weight, mm_dtype)
        grad_h = torch.zeros_like(hidden) if need_h else None
        # the weight's gradient accumulates in place over the chunks (addmm_) where the matmul
        # runs in its dtype; under autocast each chunk's product goes through one buffer
        grad_w: Tensor | None = None
        n0 = min(chunk, N)
        kept: Tensor | None = ctx.logits  # type: ignore[attr-defined]
        ctx.logits = None  # type: ignore[attr-defined]
        z_buf = (
            kept if kept is not None else torch.empty(n0, V, dtype=mm_dtype, device=hidden.device)
        )
        gw_buf = (
            torch.empty(weight.shape, dtype=mm_dtype, device=weight.device)
            if need_w and mm_dtype != dt and chunk < N
            else None
        )
        fused: Fused = ctx.fused  # type: ignore[attr-defined]
        compiled = fused_kernels.wanted(fused, hidden.device, dt)
        # the compiled passes take the temperature as a tensor (made only for them: a host
        # scalar copied to a CUDA device would synchronise)
        inv_t_t = torch.tensor(inv_t, dtype=dt, device=hidden.device) if compiled else None
        y_buf = p_buf = rows = None  # the eager passes' workspace, made when first needed
        safe = labels.clamp(min=0)
        for s in range(0, N, chunk):
            e = min(s + chunk, N)
            n = e - s
            h = hidden[s:e].to(mm_dtype)
            z = z_buf[:n] if kept is not None else _logits(h, w, z_buf[:n], onednn)
            grad_z = None
            if compiled:
                grad_z = fused_kernels.call(
                    "backward", fused, z, safe[s:e], lse[s:e],
                    None if a is None else a[s:e], b[s:e], hot[s:e], inv_t_t, mm_dtype,
                )  # fmt: skip
                compiled = grad_z is not None
            if grad_z is None:
                if y_buf is None:
                    y_buf = (
                        z_buf if mm_dtype == dt else torch.empty(n0, V, dtype=dt, device=z.device)
                    )
                    p_buf = torch.empty_like(y_buf) if a is not None else None
                    rows = torch.arange(n0, device=z.device)
                logp = y_buf[:n]
                if logp is not z:
                    logp.copy_(z)
                if inv_t != 1.0:
                    logp.mul_(inv_t)
                logp.sub_(lse[s:e, None]).clamp_(min=_EXP_FLOOR)
                if a is None:
                    grad_z = logp.exp_().mul_(b[s:e, None])
                else:
                    grad_z = torch.exp(logp, out=p_buf[:n])  # type: ignore[index]
                    grad_z.mul_(logp.mul_(a[s:e, None]).add_(b[s:e, None]))
                grad_z[rows[:n], safe[s:e]] += hot[s:e]  # type: ignore[index]
                if grad_z.dtype != mm_dtype:
                    grad_z = z.copy_(grad_z)  # the matmul buffer is free again
            if grad_h is not None:
                grad_h[s:e] = matmul_t(grad_z, w.t()) if onednn else grad_z @ w
            if not need_w:
                continue
            if onednn:  # float32: gw_buf is None
                part = matmul_t(grad_z.t(), h.t())
                grad_w = part if grad_w is None else grad_w.add_(part)
            elif grad_w is None:
                grad_w = torch.mm(grad_z.t(), h).to(dt)
            elif gw_buf is None:
                grad_w.addmm_(grad_z.t(), h)
            else:
                grad_w += torch.mm(grad_z.t(), h, out=gw_buf)
        return (
            grad_h,
            (grad_w.to(weight.dtype) if grad_w is not None else None),
            None,
            None,
            None,
            None,
            None,
            None,
        )


def chunked_logprobs_entropy(
    hidden: Tensor,
    lm_head_weight: Tensor,
    labels: Tensor,
    temperature: float = 1.0,
    chunk: int = 512,
    with_entropy: bool = True,
    fused: Fused = "auto",
    onednn: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Per-token log-prob (and entropy) from final hidden states, chunk by chunk.

    ``hidden [..., H]`` and ``lm_head_weight [V, H]`` -> ``(logprobs, entropy)`` of
    ``labels``' shape, float32; gradients flow to both ``hidden`` and ``lm_head_weight``
    while only ``[chunk, V]`` logits exist at any time, in forward and in backward.
    ``fused``: the compiled element-wise passes (:mod:`agentrl.algos.fused`): ``auto`` on
    CPU where they compile, ``on`` (an error if they cannot run), ``off``. ``onednn``: the
    LM-head products by oneDNN where they run in float32 on a CPU (the model's LM head is
    routed, ``model.cpu_linear``; :mod:`agentrl.cpu_linear`).
    """
    fused_kernels.check_mode(fused)
    _check_labels(hidden.shape[:-1], labels, "hidden")
    if lm_head_weight.dim() != 2 or lm_head_weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"lm_head_weight must be [V, H] with H = {hidden.shape[-1]} "
            f"(got {tuple(lm_head_weight.shape)})"
        )
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1 (got {chunk})")
    flat = hidden.reshape(-1, hidden.shape[-1])
    lp, ent = _LinearLogprobEntropy.apply(
        flat,
        lm_head_weight,
        labels.reshape(-1),
        _inv_temperature(temperature),
        chunk,
        with_entropy,
        fused,
        onednn,
    )
    return lp.reshape(labels.shape), (ent.reshape(labels.shape) if with_entropy else None)


def sequence_logprobs_entropy(
    hidden: Tensor,
    lm_head_weight: Tensor,
    input_ids: Tensor,
    temperature: float = 1.0,
    chunk: int = 512,
    with_entropy: bool = True,
    fused: Fused = "auto",
) -> tuple[Tensor, Tensor | None]:
    """Like :func:`chunked_logprobs_entropy` but aligned with ``input_ids [B, T]``:
    ``out[:, t] = log p(input_ids[:, t] | input_ids[:, :t])``, and ``out[:, 0] = 0``."""
    lp, ent = chunked_logprobs_entropy(
        hidden[:, :-1], lm_head_weight, input_ids[:, 1:], temperature, chunk, with_entropy, fused
    )
    zero = lp.new_zeros(lp.shape[0], 1)
    lp = torch.cat([zero, lp], dim=1)
    if ent is not None:
        ent = torch.cat([zero, ent], dim=1)
    return lp, ent
