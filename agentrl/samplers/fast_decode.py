"""A compact one-token decode step for Llama-family models on CPU.

At a small batch (a GRPO step's 16 rows) a decode step of a small model is its linear
layers reading cold weights, plus the Python and dispatch cost of transformers' module tree
(norms, RoPE, attention interface, cache bookkeeping: ~40 ops a layer). Four things make it
cheaper here, all measured in ``benchmarks/sampler_profile.py``:

* the linears are computed as ``W @ x^T`` (an ``[out, rows]`` product, then a transposed
  view), which CPU GEMM kernels run 1.4-1.9x faster than ``x @ W^T`` when ``rows`` is small
  (``SKINNY_ROWS``): the weight streams through once as the long operand. Above 8 rows
  the narrow side is zero-padded to a multiple of 8 (``ROW_MULTIPLE``): on the AVX2 machine
  15 rows took 60 ms of layer GEMMs a step against 32 ms for 16, because the GEMM's packed
  panel is 8 columns wide and a ragged edge falls to a slow path. Rows finish at different
  lengths, so a GRPO batch spends most of its decode at such counts
  (``benchmarks/sampler_profile.py --rows``);
* on AVX2 CPUs in float32, those linears (1-32 rows) run through a small compiled kernel
  that streams each weight once with the rows' accumulators in registers
  (:mod:`agentrl.samplers.skinny_gemm`; 52 vs 83 ms for all the weights at 16 rows);
* one flat function per step over the model's own tensors, with the attention written for
  one query position (one ``bmm`` for the scores of all query heads that share a key/value
  head, one for the output) and the keys/values appended in place into the sampler's cache;
* in float32 with those kernels built and the sampler's in-place cache, that function as
  one compiled call (:func:`agentrl.samplers.skinny_gemm.decode_step`,
  :meth:`FastDecoder.compiled`): no per-op Python and dispatch cost (~1,000 small ops a
  step for 30 layers): 81 vs 116 ms a step at 16 rows, 81 vs 108 ms at 13.

:class:`FastDecoder` holds references to the model's parameters, not copies: weights
copied into the model (a weight update) are used by the next step. It supports the
architectures whose layer is exactly Llama's (RMSNorm, RoPE from the model's own rotary
module, grouped-query attention with optional q/k/v/o biases, a SiLU-gated MLP):
``llama``, ``mistral`` and ``qwen2`` without sliding windows. :func:`fast_decoder` returns
None for anything else, and checks the compact step against the model's own forward on a
small input before it is used; a mismatch keeps transformers' path (logged).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch
from torch import Tensor

from agentrl.samplers import skinny_gemm
from agentrl.samplers.kv_cache import GrowingLayer

log = logging.getLogger(__name__)

ARCHITECTURES = ("llama", "mistral", "qwen2")
SKINNY_ROWS = 64  # up to this many rows W @ x^T beats x @ W^T on CPU (sampler_profile.py)
ROW_MULTIPLE = 8  # above this many rows, W @ x^T gets x padded to a multiple of it


def padded_rows(rows: int) -> int:
    """The column count ``W @ x^T`` runs at for `rows` rows (see the module docstring)."""
    if rows <= ROW_MULTIPLE:
        return rows  # up to one panel, the ragged GEMM is as fast as the padded one
    return -(-rows // ROW_MULTIPLE) * ROW_MULTIPLE


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, skinny: bool = True) -> Tensor:
    """``x @ weight^T + bias`` for 2-D `x`; up to 32 float32 rows on an AVX2 CPU go through
    the compiled kernel (:mod:`agentrl.samplers.skinny_gemm`; `skinny` False: never), other
    few-row calls through ``weight @ x^T``."""
    rows = x.shape[0]
    if skinny and skinny_gemm.usable(x, weight):
        out = skinny_gemm.skinny_linear(x, weight)
    elif rows > SKINNY_ROWS:
        out = torch.mm(x, weight.t())
    else:
        padded = padded_rows(rows)
        if padded != rows:
            x = torch.nn.functional.pad(x, (0, 0, 0, padded - rows))
        out = torch.mm(weight, x.t())[:, :rows].t()
    return out if bias is None else out + bias


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """transformers' Llama RMSNorm: normalised in float32, scaled in the input dtype."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return torch.nn.functional.rms_norm(x, weight.shape, weight, eps)  # one fused op
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE on ``[rows, heads, head_dim]`` with per-row ``cos`` / ``sin`` ``[rows, 1, head_dim]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def unsupported(model: Any) -> str:
    """Why `model` has no compact decode step ('' when it has one)."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in ARCHITECTURES:
        return f"model_type {kind!r} is not one of {', '.join(ARCHITECTURES)}"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} (the compact MLP is SiLU-gated)"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "no model.layers / model.rotary_emb"
    for layer in inner.layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if attn is None or mlp is None:
            return "a layer without self_attn / mlp"
        if any(not hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
            return "an attention without q/k/v/o projections"
        if any(not hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
            return "an MLP without gate/up/down projections"
        if hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
            return "per-head q/k norms"
    return ""


class FastDecoder:
    """One decode step (one new token per row) over the model's weights and a cache whose
    ``layers[i].update(keys, values)`` appends and returns the whole ``[rows, kv_heads,
    length, head_dim]`` keys/values (:class:`~agentrl.samplers.kv_cache.GrowingCache`).

    `autocast`: the model's float32 weights are computed on as CPU bf16 autocast would (a bf16
    sampler sharing a learner's float32 masters, ``HFSampler.share_weights``): the compiled
    step in its rounded form over a bf16 cache, else the Python step under
    :func:`agentrl.algos.bf16.cpu_autocast` (`rounded_matmuls`: its matmuls rounded, see
    there)."""

    def __init__(self, model: Any, autocast: bool = False, rounded_matmuls: bool = True) -> None:
        why = unsupported(model)
        if why:
            raise ValueError(f"no compact decode step for this model: {why}")
        inner = model.model
        config = model.config
        self.rotary = inner.rotary_emb
        self.skinny = True  # the compiled few-row GEMM where it applies (skinny_gemm.py)
        self.one_call = True  # with it, the whole step as one compiled call (compiled())
        self.autocast = autocast
        self.rounded_matmuls = rounded_matmuls
        self.embed = inner.embed_tokens.weight
        self.norm = inner.norm.weight
        self.eps = float(getattr(inner.norm, "variance_epsilon", config.rms_norm_eps))
        self.head = model.get_output_embeddings().weight
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        self.layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append(
                (
                    layer.input_layernorm.weight,
                    float(getattr(layer.input_layernorm, "variance_epsilon", self.eps)),
                    *(
                        (proj.weight, proj.bias)
                        for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
                    ),
                    float(getattr(attn, "scaling", self.head_dim**-0.5)),
                    layer.post_attention_layernorm.weight,
                    float(getattr(layer.post_attention_layernorm, "variance_epsilon", self.eps)),
                    mlp.gate_proj.weight,
                    mlp.up_proj.weight,
                    mlp.down_proj.weight,
                )
            )
        self._compiled_args = self._flat_layers()

    def _flat_layers(self) -> tuple[list[Tensor], list[float]] | None:
        """The layers' tensors and scalars as the compiled step takes them (13 tensors and 3
        floats a layer), or None when a tensor is not a contiguous float32 CPU one."""
        none = torch.empty(0)
        tensors: list[Tensor] = []
        scalars: list[float] = []
        for ln1, eps1, *projs, scale, ln2, eps2, wg, wu, wd in self.layers:
            tensors.append(ln1)
            for weight, bias in projs:
                tensors += [weight, none if bias is None else bias]
            tensors += [ln2, wg, wu, wd]
            scalars += [eps1, eps2, scale]
        if any(
            t.numel()
            and (t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous())
            for t in (*tensors, self.norm, self.head, self.embed)
        ):
            return None
        return tensors, scalars

    def compiled(self, rows: int, cache: Any) -> bool:
        """Whether a step of `rows` rows over `cache` runs as one compiled call
        (:func:`agentrl.samplers.skinny_gemm.decode_step`): float32 weights on CPU, 1-32
        rows, a :class:`~agentrl.samplers.kv_cache.GrowingCache` that holds keys (in bf16
        under :attr:`autocast`, else float32), the kernel built, and :attr:`skinny` and
        :attr:`one_call` on."""
        layers = getattr(cache, "layers", ())
        kv_dtype = torch.bfloat16 if self.autocast else torch.float32
        return (
            self.skinny
            and self.one_call
            and self._compiled_args is not None
            and 1 <= rows <= skinny_gemm.MAX_ROWS
            and len(layers) == len(self.layers)
            and all(
                isinstance(layer, GrowingLayer)
                and isinstance(layer.keys, Tensor)
                and layer.keys.dim() == 4
                and layer.keys.dtype == layer.values.dtype == kv_dtype
                for layer in layers
            )
            and skinny_gemm.available()
        )

    @torch.inference_mode()
    def step(self, ids: Tensor, positions: Tensor, cache: Any, pads: list[int]) -> Tensor:
        """Logits ``[rows, vocab]`` of the next token after `ids` ``[rows]`` at `positions`
        ``[rows]``; their keys/values are appended to `cache`. `pads`: each row's count of
        left-padding columns in the cache, which attention skips."""
        if self.autocast and not self.compiled(ids.shape[0], cache):
            from agentrl.algos.bf16 import cpu_autocast

            with cpu_autocast(self.rounded_matmuls):
                return self._step(ids, positions, cache, pads)
        return self._step(ids, positions, cache, pads)

    def _step(self, ids: Tensor, positions: Tensor, cache: Any, pads: list[int]) -> Tensor:
        rows = ids.shape[0]
        skinny = self.skinny and not self.autocast  # the compiled GEMM knows no autocast

        def lin(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
            return linear(x, weight, bias, skinny)

        h = self.embed.index_select(0, ids)  # [rows, hidden]
        cos, sin = self.rotary(h, positions.view(rows, 1))  # [rows, 1, head_dim]
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        if self.compiled(rows, cache):
            assert self._compiled_args is not None
            tensors, scalars = self._compiled_args
            room = [layer.reserve(1) for layer in cache.layers]
            logits = skinny_gemm.decode_step(
                h,
                cos,
                sin,
                pads,
                tensors,
                scalars,
                room,
                heads,
                kv_heads,
                dim,
                self.norm,
                self.eps,
                self.head,
                rounded=self.autocast,
            )
            for layer in cache.layers:
                layer.advance(1)
            return logits
        group = heads // kv_heads
        mask: Tensor | None = None
        if any(pads):
            length = cache.layers[0].keys.shape[-2] + 1  # after this step's append
            columns = torch.arange(length, device=ids.device)
            pad = torch.tensor(pads, device=ids.device).view(rows, 1, 1, 1)
            mask = columns.view(1, 1, 1, length) < pad  # True where a column is padding
        for i, layer in enumerate(self.layers):
            (ln1, eps1, (wq, bq), (wk, bk), (wv, bv), (wo, bo), scale, ln2, eps2, wg, wu, wd) = (
                layer
            )
            x = _rms_norm(h, ln1, eps1)
            q = _rotate(lin(x, wq, bq).reshape(rows, heads, dim), cos, sin)
            k = _rotate(lin(x, wk, bk).reshape(rows, kv_heads, dim), cos, sin)
            v = lin(x, wv, bv).reshape(rows, kv_heads, dim)
            keys, values = cache.layers[i].update(k.unsqueeze(2), v.unsqueeze(2))
            if self.autocast:  # as bf16 SDPA: bf16 q/k/v, float32 scores and softmax
                with torch.autocast("cpu", enabled=False):
                    out = _attend(
                        q.to(torch.bfloat16).float(),
                        keys.float(),
                        values.float(),
                        scale,
                        mask,
                        group,
                    ).to(torch.bfloat16)
            else:
                out = _attend(q, keys, values, scale, mask, group)
            h = h + lin(out.reshape(rows, heads * dim), wo, bo)
            x = _rms_norm(h, ln2, eps2)
            gate = torch.nn.functional.silu(lin(x, wg))
            h = h + lin(gate.mul_(lin(x, wu)), wd)
        return lin(_rms_norm(h, self.norm, self.eps), self.head).contiguous()


def _attend(
    q: Tensor, keys: Tensor, values: Tensor, scale: float, mask: Tensor | None, group: int
) -> Tensor:
    """One query position's attention: `q` ``[rows, heads, dim]`` over `keys` / `values`
    ``[rows, kv_heads, length, dim]`` (`mask` True at padding), ``[rows*kv_heads, group,
    dim]`` out."""
    rows, kv_heads, length, dim = keys.shape
    # [rows*kv, L, D] @ [rows*kv, D, group]: the query heads of a kv head at once
    scores = torch.bmm(
        keys.reshape(rows * kv_heads, length, dim),
        q.reshape(rows * kv_heads, group, dim).transpose(1, 2),
    )
    scores = scores.view(rows, kv_heads, length, group).transpose(-1, -2).float()
    scores.mul_(scale)
    if mask is not None:
        scores.masked_fill_(mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(values.dtype)
    return torch.bmm(
        probs.reshape(rows * kv_heads, group, length),
        values.reshape(rows * kv_heads, length, dim),
    )


def fast_decoder(
    model: Any, new_cache: Any, autocast: bool = False, rounded_matmuls: bool = True
) -> FastDecoder | None:
    """A checked :class:`FastDecoder` for `model`, or None (unsupported architecture, or its
    step does not reproduce the model's own forward; both logged). `new_cache` makes an
    empty cache of the kind the sampler uses; `autocast` / `rounded_matmuls`: see
    :class:`FastDecoder` (the model's forward it is checked against runs the same way)."""
    why = unsupported(model)
    if why:
        log.info("compact decode step not used: %s", why)
        return None
    try:
        decoder = FastDecoder(model, autocast, rounded_matmuls)
        gap = _check(model, decoder, new_cache)
    except Exception as e:  # an unexpected module layout: keep transformers' path
        log.warning("compact decode step not used (%s: %s)", type(e).__name__, e)
        return None
    tolerance = 1e-3 if decoder.head.dtype == torch.float32 and not autocast else 0.25
    if not gap <= tolerance:
        log.warning("compact decode step not used: its logits differ from the model's by %.3g", gap)
        return None
    return decoder


@torch.inference_mode()
def _check(model: Any, decoder: FastDecoder, new_cache: Any) -> float:
    """Max |logit difference| of one compact step against the model's forward of the same
    two sequences (one left-padded) after a prefill of all but their last tokens."""
    from agentrl.models import cache_kwargs

    device = decoder.embed.device
    vocab = decoder.head.shape[0]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (2, 7), generator=gen).to(device)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # row 1: two columns of left padding
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = new_cache()

    def forward() -> contextlib.AbstractContextManager[Any]:
        if not decoder.autocast:
            return contextlib.nullcontext()
        from agentrl.algos.bf16 import cpu_autocast

        return cpu_autocast(decoder.rounded_matmuls)

    with forward():
        model(
            input_ids=ids[:, :-1],
            attention_mask=mask[:, :-1],
            position_ids=positions[:, :-1],
            use_cache=True,
            **cache_kwargs(model, cache),
        )
    fast = decoder.step(ids[:, -1], positions[:, -1], cache, pads=[0, 2])
    with forward():
        full = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
    scale = max(1.0, float(full.float().abs().max()))
    return float((fast.float() - full.float()).abs().max()) / scale
