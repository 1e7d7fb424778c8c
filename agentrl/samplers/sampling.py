"""Pick the next token of every row from its logits, vectorised over the batch.

Behaviour log-probs are ``log_softmax(logits / T)`` at the chosen token, taken before any
top-p / top-k truncation (greedy rows, T = 0, use the unscaled logits). Sampling uses the
exponential race: ``argmax(p / E)`` with ``E ~ Exp(1)`` draws from ``p``; a row with a seed
draws its noise from its own generator, so its tokens do not depend on its batch-mates.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentrl.samplers.base import SamplingParams


def sample_next(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    rng: torch.Generator,
) -> tuple[list[int], list[float], list[float] | None]:
    """Return (token ids, behaviour logprobs, entropies or None) for each row of `logits`."""
    logits = logits.float()
    vocab = logits.shape[-1]
    device = logits.device
    temps = torch.tensor([p.temperature for p in params], device=device)
    greedy = temps == 0
    scaled = logits / torch.where(greedy, torch.ones_like(temps), temps).unsqueeze(-1)
    logp = torch.log_softmax(scaled, dim=-1)

    entropies = None
    if any(p.return_entropy for p in params):
        entropies = (-(logp.exp() * logp).sum(-1)).tolist()

    chosen = logits.argmax(-1)
    sampled_rows = [i for i, p in enumerate(params) if p.temperature > 0]
    if sampled_rows:
        index = torch.tensor(sampled_rows, device=device)
        row_logp = logp.index_select(0, index)
        sub = [params[i] for i in sampled_rows]
        if any(p.top_k > 0 or p.top_p < 1.0 for p in sub):
            row_logp = _truncate(row_logp, sub)
        noise = _exponential_noise(
            len(sampled_rows), vocab, [generators[i] for i in sampled_rows], rng
        )
        picked = (row_logp.exp() / noise.to(device)).argmax(-1)
        chosen = chosen.index_copy(0, index, picked)

    token_logp = logp.gather(-1, chosen.unsqueeze(-1)).squeeze(-1)
    return chosen.tolist(), token_logp.tolist(), entropies


def _truncate(logp: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Set log-probs outside each row's top-k / nucleus to -inf (the top token always stays)."""
    device = logp.device
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    rank = torch.arange(logp.shape[-1], device=device).unsqueeze(0)
    top_k = torch.tensor(
        [p.top_k if p.top_k > 0 else logp.shape[-1] for p in params], device=device
    )
    drop = rank >= top_k.unsqueeze(-1)
    top_p = torch.tensor([p.top_p for p in params], device=device)
    probs = sorted_logp.exp()
    mass_before = probs.cumsum(-1) - probs
    drop |= mass_before >= top_p.unsqueeze(-1)
    drop[:, 0] = False
    sorted_logp = sorted_logp.masked_fill(drop, float("-inf"))
    return torch.empty_like(logp).scatter_(-1, order, sorted_logp)


def _exponential_noise(
    rows: int, vocab: int, generators: Sequence[torch.Generator | None], rng: torch.Generator
) -> torch.Tensor:
    noise = torch.empty(rows, vocab)
    shared = [i for i, g in enumerate(generators) if g is None]
    if shared:
        noise[shared] = torch.empty(len(shared), vocab).exponential_(generator=rng)
    for i, g in enumerate(generators):
        if g is not None:
            noise[i].exponential_(generator=g)
    return noise
