"""Per-token log-probs (and entropy, values) of a causal LM without ``[B, T, V]`` logits.

The decoder runs once for the hidden states; the LM head and log-softmax are applied
only at positions that predict a trained token, in chunks
(:func:`agentrl.algos.chunked_logprobs_entropy`), so prompt and observation positions
never touch the vocabulary. Output alignment follows :mod:`agentrl.types`:
``logprobs[:, t] = log softmax(logits[:, t-1] / T)[input_ids[:, t]]``, 0 where not trained.
:class:`PolicyForward` runs these per micro-batch under the learner's precision, with the
critic's values when the advantage estimator needs them.

Three ways through the decoder, all the same function of the weights (same values and
gradients up to float rounding): rows as they are (right-padded to the longest);
``learner.packing``: the rows' real tokens concatenated into one row (:func:`packed_logprobs`,
no compute on padding); ``learner.share_prompt``: a shared prompt forwarded once
(:func:`shared_prefix_logprobs`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from agentrl.algos import chunked_logprobs_entropy
from agentrl.algos.fused import Fused
from agentrl.cpu_linear import CpuLinear
from agentrl.devices import to_device, to_host
from agentrl.learner.batching import BatchLayout
from agentrl.learner.critic import ValueHead, ValueModel, shift_values
from agentrl.learner.precision import Precision
from agentrl.models import cache_kwargs, returned_cache
from agentrl.types import Batch


@dataclass
class TokenOutputs:
    logprobs: Tensor  # [B, T] aligned with input_ids, 0 outside `mask`
    entropy: Tensor | None  # [B, T] entropy of the distribution that produced token t
    hidden: Tensor | None  # [B, T, H] decoder output (for a value head on the policy)


def decoder_hidden(model: Any, input_ids: Tensor, position_ids: Tensor | None = None) -> Tensor:
    """Last hidden states ``[B, T, H]`` of a ``*ForCausalLM`` without computing logits.

    Rows are right-padded, so causal attention alone keeps real tokens from seeing the
    padding and no attention mask is needed (which keeps SDPA on its fused causal path).
    ``position_ids`` restarting at 0 inside a row mark packed sequences (see
    :func:`packed_logprobs`).
    """
    kw: dict[str, Any] = {} if position_ids is None else {"position_ids": position_ids}
    base = getattr(model, "base_model", None)
    if base is None or base is model:
        out = model(input_ids=input_ids, output_hidden_states=True, use_cache=False, **kw)
        return out.hidden_states[-1]
    if _fsdp_root(model):  # FSDP2 gathers the root's weights in the root's forward only
        out = model(
            input_ids=input_ids, output_hidden_states=True, use_cache=False, logits_to_keep=1, **kw
        )
        return out.hidden_states[-1]
    return base(input_ids=input_ids, use_cache=False, **kw)[0]


def _fsdp_root(model: Any) -> bool:
    """Whether `model` is an FSDP2 root (``learner.parallel: fsdp``; see
    :mod:`agentrl.learner.distributed`)."""
    return any(cls.__name__ == "FSDPModule" for cls in type(model).__mro__)


def checkpointing_active(model: Any) -> bool:
    """Whether a forward of `model` now runs under activation (gradient) checkpointing:
    enabled on a layer, the model in training mode, gradients on."""
    if not (model.training and torch.is_grad_enabled()):
        return False
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


@dataclass(frozen=True)
class Packing:
    """Where a micro-batch's real tokens go in its packed rows.

    The sequences (row ``i``: its first ``lengths[i]`` tokens) are laid end to end into
    ``rows`` rows of ``width`` tokens, first-fit by decreasing length; the rest of a packed
    row is padding. ``positions [rows, width]`` restart at 0 for every sequence (and for a
    row's padding tail): transformers reads packed sequences from them
    (``masking_utils.find_packed_sequence_indices``) and builds a block-diagonal causal
    mask for sdpa / eager / flex attention, or varlen boundaries for flash-attention, so
    no token attends across sequences. ``src`` / ``dst``: flat indices of the real tokens
    in the ``[b, L]`` and the ``[rows, width]`` layout.
    """

    src: Tensor  # [N] into b * L
    dst: Tensor  # [N] into rows * width
    positions: Tensor  # [rows, width]
    shape: tuple[int, int]  # (b, L)
    host: Packing | None = None  # the same packing on the host (packs host-side masks)

    @classmethod
    def of(
        cls, lengths: Tensor, length: int, device: torch.device, *, width: int | None = None
    ) -> Packing:
        """Rows of `width` tokens (default: the longest sequence, so attention never costs
        more than unpacked); ``width >= lengths.sum()`` packs everything into one row."""
        lens = [int(n) for n in lengths]
        width = max(max(lens), width or 0)
        free: list[int] = []  # tokens left per packed row
        place: list[tuple[int, int]] = [(0, 0)] * len(lens)  # (packed row, offset)
        for i in sorted(range(len(lens)), key=lambda i: -lens[i]):
            row = next((r for r, f in enumerate(free) if f >= lens[i]), None)
            if row is None:
                row = len(free)
                free.append(width)
            place[i] = (row, width - free[row])
            free[row] -= lens[i]
        src, dst = [], []
        positions = torch.zeros(len(free), width, dtype=torch.long)
        for i, (row, offset) in enumerate(place):
            src.append(torch.arange(lens[i]) + i * length)
            dst.append(torch.arange(lens[i]) + row * width + offset)
            positions[row, offset : offset + lens[i]] = torch.arange(lens[i])
        for row, f in enumerate(free):  # the padding tail: a sequence of its own
            positions[row, width - f :] = torch.arange(f)
        host = cls(torch.cat(src), torch.cat(dst), positions, (len(lens), length))
        if device.type == "cpu":
            return host
        return cls(
            to_device(host.src, device),
            to_device(host.dst, device),
            to_device(host.positions, device),
            host.shape,
            host,
        )

    @property
    def rows(self) -> int:
        return self.positions.shape[0]

    @property
    def width(self) -> int:
        return self.positions.shape[1]

    def saves(self) -> bool:
        """Whether the packed rows hold fewer tokens than the padded ones."""
        return self.rows * self.width < self.shape[0] * self.shape[1]

    def pack(self, x: Tensor) -> Tensor:
        """``[b, L, ...]`` -> ``[rows, width, ...]``, zeros in the packed rows' padding."""
        flat = x.reshape(-1, *x.shape[2:])
        out = flat.new_zeros(self.rows * self.width, *x.shape[2:])
        return out.index_copy(0, self.dst, flat[self.src]).reshape(
            self.rows, self.width, *x.shape[2:]
        )

    def unpack(self, x: Tensor) -> Tensor:
        """``[rows, width, ...]`` -> ``[b, L, ...]``, zeros at the padding (differentiable)."""
        flat = x.reshape(-1, *x.shape[2:])
        b, L = self.shape
        out = flat.new_zeros(b * L, *x.shape[2:])
        return out.index_copy(0, self.src, flat[self.dst]).reshape(b, L, *x.shape[2:])


def packed_logprobs(
    model: Any,
    input_ids: Tensor,
    mask: Tensor,
    lengths: Tensor | None = None,
    *,
    packing: Packing | None = None,
    temperature: float = 1.0,
    chunk: int = 512,
    with_entropy: bool = False,
    keep_hidden: bool = False,
    fused: Fused = "auto",
) -> TokenOutputs:
    """:func:`token_logprobs` for right-padded rows of `lengths` real tokens, forwarded
    packed (`packing`, default :meth:`Packing.of` `lengths`): no decoder compute on
    padding. Returns the same ``[b, L]`` layout."""
    if packing is None:
        assert lengths is not None, "packed_logprobs needs lengths or a packing"
        packing = Packing.of(lengths, input_ids.shape[1], input_ids.device)
    ids = packing.pack(input_ids)
    # a sequence's first token has no context: never predicted (from the previous sequence)
    on_mask = packing.host if packing.host is not None and mask.device.type == "cpu" else packing
    m = on_mask.pack(mask) * (on_mask.positions > 0)
    hidden = decoder_hidden(model, ids, packing.positions)  # [rows, width, H]
    lp, ent = _predicted_logprobs(
        model, hidden[:, :-1], ids, m, 1, temperature, chunk, with_entropy, fused
    )
    return TokenOutputs(
        packing.unpack(lp),
        packing.unpack(ent) if ent is not None else None,
        packing.unpack(hidden) if keep_hidden else None,
    )


def lm_head_weight(model: Any) -> Tensor:
    head = model.get_output_embeddings()
    if head is None or getattr(head, "bias", None) is not None:
        raise ValueError(
            "the learner needs a bias-free linear LM head (model.get_output_embeddings())"
        )
    return head.weight


def token_logprobs(
    model: Any,
    input_ids: Tensor,
    mask: Tensor,
    *,
    temperature: float = 1.0,
    chunk: int = 512,
    with_entropy: bool = False,
    keep_hidden: bool = False,
    fused: Fused = "auto",
) -> TokenOutputs:
    """Log-probs of `input_ids` under `model` at positions where ``mask`` is set.

    ``mask[:, 0]`` is ignored (the first token has no context to be predicted from).
    ``fused``: the compiled log-softmax passes, see :mod:`agentrl.algos.fused`.
    """
    hidden = decoder_hidden(model, input_ids)
    lp, ent = _predicted_logprobs(
        model, hidden[:, :-1], input_ids, mask, 1, temperature, chunk, with_entropy, fused
    )
    return TokenOutputs(lp, ent, hidden if keep_hidden else None)


def _predicted_logprobs(
    model: Any,
    pred: Tensor,
    input_ids: Tensor,
    mask: Tensor,
    start: int,
    temperature: float,
    chunk: int,
    with_entropy: bool,
    fused: Fused,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropy) ``[B, T]`` of tokens ``start:`` where ``mask`` is set.

    ``pred[:, j]`` is the decoder state that predicts ``input_ids[:, start + j]``; only the
    masked positions reach the LM head (chunked), the rest are 0.
    """
    shape = (pred.shape[0], pred.shape[1])
    at = selected_positions(mask[:, start:], pred.device)  # [N] into the flattened rows
    lp_sel, ent_sel = chunked_logprobs_entropy(
        pred.reshape(-1, pred.shape[-1]).index_select(0, at),
        lm_head_weight(model),
        input_ids[:, start:].reshape(-1).index_select(0, at),
        temperature=temperature,
        chunk=chunk,
        with_entropy=with_entropy,
        fused=fused,
        onednn=type(model.get_output_embeddings()) is CpuLinear,  # model.cpu_linear
    )

    def place(values: Tensor) -> Tensor:
        zeros = values.new_zeros(shape[0] * shape[1])
        return torch.nn.functional.pad(zeros.index_copy(0, at, values).reshape(shape), (start, 0))

    return place(lp_sel), place(ent_sel) if ent_sel is not None else None


def selected_positions(mask: Tensor, device: torch.device) -> Tensor:
    """Flat indices of the set positions of ``mask [B, T]``, on `device`.

    A mask on the host (as the learner passes it) is searched there, so the number of
    positions is known without waiting on the device; a mask already on a CUDA device
    costs one synchronisation here."""
    at = torch.nonzero(mask.reshape(-1) > 0).squeeze(1)
    return to_device(at, device)


def shared_prefix_logprobs(
    model: Any,
    input_ids: Tensor,
    mask: Tensor,
    prefix_len: int,
    *,
    temperature: float = 1.0,
    chunk: int = 512,
    with_entropy: bool = False,
    keep_hidden: bool = False,
    fused: Fused = "auto",
) -> TokenOutputs:
    """:func:`token_logprobs` for rows that share their first `prefix_len` tokens exactly.

    The shared prefix (a group's prompt) runs through the decoder once; its KV cache is
    repeated for every row and only the suffixes are forwarded. Gradients flow back through
    the repeated cache into the single prefix pass, so this is the same function of the
    weights as the plain path (same values, same gradients up to float rounding) at a
    fraction of the compute when the prompt dominates the sequence, as in GRPO groups.
    """
    B, T = input_ids.shape
    P = prefix_len
    if not 0 < P < T:
        raise ValueError(f"prefix_len must be in (0, {T}) for rows of length {T} (got {P})")
    base = getattr(model, "base_model", None)
    if base is None or base is model:
        raise ValueError("shared-prefix forwarding needs a *ForCausalLM with a base_model")
    prefix = base(input_ids=input_ids[:1, :P], use_cache=True)
    cache = returned_cache(prefix)
    cache.batch_repeat_interleave(B)
    positions = torch.arange(P, T, device=input_ids.device).unsqueeze(0).expand(B, -1)
    suffix = base(
        input_ids=input_ids[:, P:],
        position_ids=positions,
        use_cache=True,
        **cache_kwargs(base, cache),
    ).last_hidden_state  # [B, T-P, H]
    prefix_hidden = prefix.last_hidden_state  # [1, P, H]
    # position t-1 predicts token t: the prefix's last state predicts the first suffix token
    pred = torch.cat([prefix_hidden[:, -1:].expand(B, -1, -1), suffix[:, :-1]], dim=1)
    lp, ent = _predicted_logprobs(
        model, pred, input_ids, mask, P, temperature, chunk, with_entropy, fused
    )
    hidden = None
    if keep_hidden:
        hidden = torch.cat([prefix_hidden.expand(B, -1, -1), suffix], dim=1)
    return TokenOutputs(lp, ent, hidden)


@dataclass
class PolicyForward:
    """One micro-batch forward as the learner runs it: log-probs, entropy and values.

    Values come from `value_head` on the policy's hidden states, or from a separate
    `critic`; with neither, ``with_values`` must be false.
    """

    precision: Precision
    temperature: float = 1.0
    chunk: int = 512
    fused: Fused = "auto"
    value_head: ValueHead | None = None
    critic: ValueModel | None = None
    packing: bool = False  # learner.packing

    def __call__(
        self,
        model: Any,
        input_ids: Tensor,
        mask: Tensor,
        *,
        with_entropy: bool,
        with_values: bool,
        prefix_len: int = 0,
        lengths: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """(logprobs, entropy, values) for one micro-batch, all float32 ``[b, L]``.

        ``prefix_len > 0``: the rows share that many leading tokens (forwarded once), unless
        activation checkpointing is on (it drops the prefix's KV cache; the rows go whole).
        ``lengths``: real tokens per row; with :attr:`packing` on and padding to save, the
        rows are forwarded packed (:func:`packed_logprobs`)."""
        forward: Any = token_logprobs
        packing: Packing | None = None
        width = input_ids.shape[1]
        if prefix_len > 0 and not checkpointing_active(model):
            forward = functools.partial(shared_prefix_logprobs, prefix_len=prefix_len)
        elif self.packing and lengths is not None and len(lengths) > 1:
            # one row: rows of the longest sequence would rarely pair two sequences, since
            # micro-batches are cut from rows sorted by length
            packing = Packing.of(lengths, width, input_ids.device, width=int(lengths.sum()))
            if packing.saves():
                forward = functools.partial(packed_logprobs, packing=packing)
                width = packing.width
            else:
                packing = None
        with self.precision.autocast(), self.precision.attention(width):
            out = forward(
                model,
                input_ids,
                mask,
                temperature=self.temperature,
                chunk=self.chunk,
                with_entropy=with_entropy,
                fused=self.fused,
                keep_hidden=with_values and self.value_head is not None,
            )
            values = None
            if with_values:
                if self.value_head is not None:
                    assert out.hidden is not None
                    values = shift_values(self.value_head(out.hidden))
                else:
                    assert self.critic is not None, "with_values needs a value head or a critic"
                    if packing is None:
                        raw = self.critic(input_ids)
                    else:
                        raw = packing.unpack(
                            self.critic(packing.pack(input_ids), position_ids=packing.positions)
                        )
                    values = shift_values(raw)
        ent = out.entropy.float() if out.entropy is not None else None
        return out.logprobs.float(), ent, values.float() if values is not None else None

    @torch.no_grad()
    def whole_rows(
        self,
        model: Any,
        batch: Batch,
        layout: BatchLayout,
        rows: Tensor,
        *,
        with_values: bool = False,
        with_entropy: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """(logprobs, entropy, values) ``[B, T]`` on CPU for `rows`, without gradients."""
        B, T = batch.input_ids.shape
        lp = torch.zeros(B, T)
        ent = torch.zeros(B, T) if with_entropy else None
        values = torch.zeros(B, T) if with_values else None
        device = self.precision.device
        pending: list[tuple[Tensor, Tensor, int, Tensor]] = []
        for idx, L, P in layout.micro_batches(rows):
            ids = to_device(batch.input_ids[idx, :L], device)
            lp_mb, ent_mb, v_mb = self(
                model,
                ids,
                batch.loss_mask[idx, :L],  # on the host: see selected_positions
                with_entropy=with_entropy,
                with_values=with_values,
                prefix_len=P,
                lengths=layout.lengths[idx],
            )
            for target, out in ((lp, lp_mb), (ent, ent_mb), (values, v_mb)):
                if target is not None and out is not None:
                    pending.append((target, idx, L, out))
        # read to the host once, after every micro-batch was queued (no wait in between)
        for (target, idx, L, _), out in zip(pending, to_host([p[3] for p in pending]), strict=True):
            target[idx, :L] = out
        return lp, ent, values
