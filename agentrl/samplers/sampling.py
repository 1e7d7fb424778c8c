"""Pick the next token of every row from its logits, vectorised over the batch.

Behaviour log-probs are ``log_softmax(logits / T)`` at the chosen token, taken before any
top-p / top-k truncation (greedy rows, T = 0, use the unscaled logits). Sampling inverts
the CDF: one uniform draw per row, located in the row's float64 cumulative sum of ``p``
(``searchsorted``, so a token of probability 0 is never drawn). One random number per row
instead of one per vocabulary entry: at 64 rows x 49k tokens that is 4 ms a step, where the
exponential race (``argmax(p / E)``, ``E ~ Exp(1)``) spent 65 ms drawing noise. A row with a
seed draws from its own generator, so its tokens do not depend on its batch-mates.

Every full-vocabulary pass counts here (the sampler makes one call per decode step), so the
probabilities come from one fused ``softmax`` and the log-normaliser from the probability
of the row's maximum (``p_max = 1 / sum(exp(x - max))``) instead of a separate
``log_softmax`` plus ``exp``: 6.7 -> 2.6 ms at 96 rows x 49k.
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
    x = logits.float()
    device = x.device
    temps = [p.temperature for p in params]
    if any(t != 1.0 for t in temps):
        divisor = torch.tensor([t if t > 0 else 1.0 for t in temps], device=device)
        x = x / divisor.unsqueeze(-1)  # greedy rows keep their unscaled logits
    probs = torch.softmax(x, dim=-1)
    # log Z = max + log sum(exp(x - max)) = max - log max(p); amax is a fast reduction,
    # max/argmax (with indices) took 2 ms at 96 x 49k
    log_z = x.amax(dim=-1) - probs.amax(dim=-1).log()

    entropy = None
    if any(p.return_entropy for p in params):
        # H = log Z - sum_v p_v x_v, the dot product without a [rows, V] temporary
        expected = torch.bmm(probs.unsqueeze(1), x.unsqueeze(2)).view(-1)
        entropy = log_z - expected

    sampled_rows = [i for i, t in enumerate(temps) if t > 0]
    if len(sampled_rows) < len(temps):
        chosen = x.argmax(dim=-1)
    else:
        chosen = torch.empty(len(temps), dtype=torch.long, device=device)
    if sampled_rows:
        all_rows = len(sampled_rows) == len(temps)
        # the common case (every row samples) needs no row index: no host-to-device copy
        index = None if all_rows else torch.tensor(sampled_rows, device=device)
        row_probs = probs if index is None else probs.index_select(0, index)
        sub = [params[i] for i in sampled_rows]
        if any(p.top_k > 0 or p.top_p < 1.0 for p in sub):
            row_probs = _truncate(row_probs, sub)
        uniform = _uniforms([generators[i] for i in sampled_rows], rng)
        picked = _inverse_cdf(row_probs, uniform.to(device))
        chosen = picked if index is None else chosen.index_copy(0, index, picked)

    token_logp = x.gather(-1, chosen.unsqueeze(-1)).squeeze(-1) - log_z
    # one device-to-host copy (one sync on a GPU) for everything: float64 holds the token
    # ids exactly and the float32 values unchanged
    parts = [chosen, token_logp] if entropy is None else [chosen, token_logp, entropy]
    host = torch.stack([t.double() for t in parts]).tolist()
    tokens = [int(t) for t in host[0]]
    return tokens, host[1], host[2] if entropy is not None else None


def _truncate(probs: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Zero the probabilities outside each row's top-k / nucleus (the top token stays)."""
    device = probs.device
    sorted_p, order = probs.sort(dim=-1, descending=True)
    rank = torch.arange(probs.shape[-1], device=device).unsqueeze(0)
    top_k = torch.tensor(
        [p.top_k if p.top_k > 0 else probs.shape[-1] for p in params], device=device
    )
    drop = rank >= top_k.unsqueeze(-1)
    top_p = torch.tensor([p.top_p for p in params], device=device)
    mass_before = sorted_p.cumsum(-1) - sorted_p
    drop |= mass_before >= top_p.unsqueeze(-1)
    drop[:, 0] = False
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    return torch.empty_like(probs).scatter_(-1, order, sorted_p)


def _uniforms(generators: Sequence[torch.Generator | None], rng: torch.Generator) -> torch.Tensor:
    """One U[0, 1) draw per row (float64): from the row's own generator, else from `rng`."""
    shared = [i for i, g in enumerate(generators) if g is None]
    if len(shared) == len(generators):  # the same draws as below, without the scatter
        return torch.rand(len(shared), dtype=torch.float64, generator=rng)
    u = torch.empty(len(generators), dtype=torch.float64)
    if shared:
        u[shared] = torch.rand(len(shared), dtype=torch.float64, generator=rng)
    for i, g in enumerate(generators):
        if g is not None:
            u[i] = torch.rand(1, dtype=torch.float64, generator=g)[0]
    return u


_BLOCK = 256  # tokens per block of the two-level inverse CDF


def _inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Draw a token per row from ``probs`` (rows may be unnormalised or truncated).

    Two levels keep it exact and cheap: a float64 CDF over blocks of 256 tokens picks the
    block, then a float64 CDF inside that one block picks the token (a float64 cumsum over
    the whole vocabulary costs 12 ms at 32 x 49k; this costs ~1 ms). Each target is kept
    strictly below its CDF's total, so a token of probability 0 is never drawn.
    """
    rows, vocab = probs.shape
    if pad := (-vocab) % _BLOCK:
        probs = torch.nn.functional.pad(probs, (0, pad))
    blocks = probs.view(rows, -1, _BLOCK)
    mass = blocks.sum(-1).double()
    cdf = mass.cumsum(-1)
    target = _below(uniform.double() * cdf[:, -1], cdf[:, -1])
    block = torch.searchsorted(cdf, target.unsqueeze(-1), right=True).squeeze(-1)
    rest = (target - (cdf - mass).gather(-1, block.unsqueeze(-1)).squeeze(-1)).clamp_(min=0)
    inner = blocks[torch.arange(rows, device=probs.device), block].double().cumsum(-1)
    rest = _below(rest, inner[:, -1])
    offset = torch.searchsorted(inner, rest.unsqueeze(-1), right=True).squeeze(-1)
    return block * _BLOCK + offset


def _below(value: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """``value`` clamped to just under ``total`` (right-searchsorted then lands on p > 0)."""
    return torch.minimum(value, torch.nextafter(total, torch.zeros_like(total)))
