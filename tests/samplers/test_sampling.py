"""sample_next: draws follow softmax(logits / T), truncation excludes what it should, the
behaviour log-prob is the untruncated one, and seeded rows ignore their batch-mates."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.samplers.base import SamplingParams
from agentrl.samplers.sampling import sample_next


def draw(logits: torch.Tensor, params: SamplingParams, rows: int, seed: int = 0):
    rng = torch.Generator().manual_seed(seed)
    batch = logits.expand(rows, -1).clone()
    return sample_next(batch, [params] * rows, [None] * rows, rng)


def test_draws_follow_the_tempered_softmax() -> None:
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -30.0])
    temperature = 0.8
    tokens, logprobs, _ = draw(logits, SamplingParams(temperature=temperature), rows=40_000)
    expected = torch.softmax(logits / temperature, -1)
    counts = torch.bincount(torch.tensor(tokens), minlength=5).double()
    chi2 = float((((counts - 40_000 * expected) ** 2) / (40_000 * expected)).sum())
    assert chi2 < 25.0, (chi2, counts)  # 4 d.o.f.: p < 1e-4 by chance
    logp = torch.log_softmax(logits / temperature, -1)
    assert all(
        math.isclose(lp, float(logp[t]), abs_tol=1e-5)
        for t, lp in zip(tokens, logprobs, strict=True)
    )


def test_zero_probability_and_truncated_tokens_are_never_drawn() -> None:
    logits = torch.tensor([0.0, float("-inf"), 0.5, 0.2, -0.1, float("-inf")])
    tokens, _, _ = draw(logits, SamplingParams(temperature=1.0), rows=5_000)
    assert {1, 5}.isdisjoint(tokens)
    tokens, logprobs, _ = draw(logits, SamplingParams(temperature=1.0, top_k=2), rows=5_000)
    assert set(tokens) == {2, 3}
    full = torch.log_softmax(logits, -1)  # behaviour log-probs stay untruncated
    assert all(
        math.isclose(lp, float(full[t]), abs_tol=1e-6)
        for t, lp in zip(tokens, logprobs, strict=True)
    )
    # top-p 0.5 over [0.5, 0.2, 0.0, -0.1] keeps the two most likely tokens
    tokens, _, _ = draw(logits, SamplingParams(temperature=1.0, top_p=0.5), rows=5_000)
    assert set(tokens) == {2, 3}


def test_seeded_rows_ignore_their_batch_mates_and_greedy_is_argmax() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 49_152)
    seeded = SamplingParams(temperature=1.0, seed=11)
    generators = [torch.Generator().manual_seed(11) if i == 2 else None for i in range(6)]
    params = [SamplingParams(temperature=1.0)] * 6
    params[2], params[4] = seeded, SamplingParams(temperature=0.0)
    rng = torch.Generator().manual_seed(1)
    tokens, _, _ = sample_next(logits, params, generators, rng)
    alone, _, _ = sample_next(
        logits[2:3], [seeded], [torch.Generator().manual_seed(11)], torch.Generator()
    )
    assert tokens[2] == alone[0]
    assert tokens[4] == int(logits[4].argmax())


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_logprobs_and_entropy_match_log_softmax(scale: float) -> None:
    torch.manual_seed(4)
    logits = torch.randn(6, 1000) * scale
    temps = [1.0, 0.7, 0.0, 1.3, 1.0, 0.2]
    params = [
        SamplingParams(temperature=t, return_entropy=True, top_p=0.9 if i == 4 else 1.0)
        for i, t in enumerate(temps)
    ]
    tokens, logprobs, entropies = sample_next(
        logits, params, [None] * 6, torch.Generator().manual_seed(0)
    )
    scaled = logits.double() / torch.tensor([t or 1.0 for t in temps], dtype=torch.float64)[:, None]
    logp = torch.log_softmax(scaled, -1)
    expected = logp[torch.arange(6), torch.tensor(tokens)]
    torch.testing.assert_close(
        torch.tensor(logprobs, dtype=torch.float64), expected, atol=1e-5, rtol=1e-6
    )
    ent = -(logp.exp() * logp).sum(-1)
    torch.testing.assert_close(
        torch.tensor(entropies, dtype=torch.float64), ent, atol=1e-4, rtol=1e-5
    )
    assert tokens[2] == int(logits[2].argmax())
