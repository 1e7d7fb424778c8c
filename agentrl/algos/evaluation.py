"""Evaluation metrics over n samples per problem: pass@k and maj@k."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from collections.abc import Set as AbstractSet


# Unbiased pass@k (Chen et al. 2021, eq. 1): 1 - C(n-c, k) / C(n, k), as a stable product
def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples (of n, c correct) is correct."""
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise TypeError(f"n, c and k must be integers (got {n!r}, {c!r}, {k!r})")
    if n < 1 or not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"need n >= 1, 0 <= c <= n and 1 <= k <= n (got n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def maj_at_k(
    answers: Sequence[Hashable | None],
    reference: Hashable | AbstractSet[Hashable],
    k: int | None = None,
) -> float:
    """1.0 if the most frequent answer among the first ``k`` is correct, else 0.0.

    ``reference`` is the correct answer, or a set of answers a verifier accepted (several
    spellings of one value). ``None`` answers (no parsable answer) do not vote. Ties go to
    the answer seen first.
    """
    if k is not None and not (1 <= k <= len(answers)):
        raise ValueError(f"need 1 <= k <= len(answers) = {len(answers)} (got k={k})")
    votes = [a for a in (answers if k is None else answers[:k]) if a is not None]
    if not votes:
        return 0.0
    counts = Counter(votes)
    best = max(counts.values())
    winner = next(a for a in votes if counts[a] == best)
    accepted = reference if isinstance(reference, AbstractSet) else {reference}
    return 1.0 if winner in accepted else 0.0
