"""Per-token log-probs (and entropy, values) of a causal LM without ``[B, T, V]`` logits.

The decoder runs once for the hidden states; the LM head and log-softmax are applied
only at positions that predict a trained token, in chunks
(:func:`agentrl.algos.chunked_logprobs_entropy`), so prompt and observation positions
never touch the vocabulary. Output alignment follows :mod:`agentrl.types`:
``logprobs[:, t] = log softmax(logits[:, t-1] / T)[input_ids[:, t]]``, 0 where not trained.
:class:`PolicyForward` runs these per micro-batch under the learner's precision, with the
critic's values when the advantage estimator needs them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from agentrl.algos.fused import Fused
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


def decoder_hidden(model: Any, input_ids: Tensor) -> Tensor:
    """Last hidden states ``[B, T, H]`` of a ``*ForCausalLM`` without computing logits.

    Rows are right-padded, so causal attention alone keeps real tokens from seeing the
    padding and no attention mask is needed (which keeps SDPA on its fused causal path).
    """
    base = getattr(model, "base_model", None)
    if base is None or base is model:
        out = model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
        return out.hidden_states[-1]
    return base(input_ids=input_ids, use_cache=False)[0]


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
    from agentrl.algos import chunked_logprobs_entropy

    sel = mask[:, start:] > 0
    lp_sel, ent_sel = chunked_logprobs_entropy(
        pred[sel],
        lm_head_weight(model),
        input_ids[:, start:][sel],
        temperature=temperature,
        chunk=chunk,
        with_entropy=with_entropy,
        fused=fused,
    )
    zeros = torch.zeros(sel.shape, dtype=lp_sel.dtype, device=lp_sel.device)
    lp = torch.nn.functional.pad(zeros.masked_scatter(sel, lp_sel), (start, 0))
    ent = None
    if ent_sel is not None:
        ent = torch.nn.functional.pad(zeros.masked_scatter(sel, ent_sel), (start, 0))
    return lp, ent


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

    def __call__(
        self,
        model: Any,
        input_ids: Tensor,
        mask: Tensor,
        *,
        with_entropy: bool,
        with_values: bool,
        prefix_len: int = 0,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """(logprobs, entropy, values) for one micro-batch, all float32 ``[b, L]``.

        ``prefix_len > 0``: the rows share that many leading tokens (forwarded once)."""
        forward = token_logprobs
        if prefix_len > 0:
            forward = functools.partial(shared_prefix_logprobs, prefix_len=prefix_len)
        with self.precision.autocast(), self.precision.attention(input_ids.shape[1]):
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
                    values = shift_values(self.critic(input_ids))
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
        for idx, L, P in layout.micro_batches(rows):
            ids = batch.input_ids[idx, :L].to(device)
            m = batch.loss_mask[idx, :L].to(device)
            lp_mb, ent_mb, v_mb = self(
                model, ids, m, with_entropy=with_entropy, with_values=with_values, prefix_len=P
            )
            lp[idx, :L] = lp_mb.cpu()
            if ent is not None and ent_mb is not None:
                ent[idx, :L] = ent_mb.cpu()
            if values is not None and v_mb is not None:
                values[idx, :L] = v_mb.cpu()
        return lp, ent, values
