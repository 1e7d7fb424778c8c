"""Per-token log-probs (and entropy, values) of a causal LM without ``[B, T, V]`` logits.

The decoder runs once for the hidden states; the LM head and log-softmax are applied
only at positions that predict a trained token, in chunks
(:func:`agentrl.algos.chunked_logprobs_entropy`), so prompt and observation positions
never touch the vocabulary. Output alignment follows :mod:`agentrl.types`:
``logprobs[:, t] = log softmax(logits[:, t-1] / T)[input_ids[:, t]]``, 0 where not trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


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
) -> TokenOutputs:
    """Log-probs of `input_ids` under `model` at positions where ``mask`` is set.

    ``mask[:, 0]`` is ignored (the first token has no context to be predicted from).
    """
    from agentrl.algos import chunked_logprobs_entropy

    hidden = decoder_hidden(model, input_ids)
    B, T = input_ids.shape
    sel = mask[:, 1:] > 0
    h = hidden[:, :-1][sel]  # [N, H]
    labels = input_ids[:, 1:][sel]  # [N]
    lp_sel, ent_sel = chunked_logprobs_entropy(
        h,
        lm_head_weight(model),
        labels,
        temperature=temperature,
        chunk=chunk,
        with_entropy=with_entropy,
    )
    zeros = torch.zeros(B, T - 1, dtype=lp_sel.dtype, device=lp_sel.device)
    lp = torch.nn.functional.pad(zeros.masked_scatter(sel, lp_sel), (1, 0))
    ent = None
    if ent_sel is not None:
        ent = torch.nn.functional.pad(zeros.masked_scatter(sel, ent_sel), (1, 0))
    return TokenOutputs(lp, ent, hidden if keep_hidden else None)
