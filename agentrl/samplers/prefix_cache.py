"""KV of token prefixes the hf sampler has already computed, for the next request that
starts with them.

Multi-turn episodes resend their whole conversation every turn, and the samples of a GRPO
group share their prompt, so most of a prefill is work done before. Entries are whole
sequences (a finished request's prompt + completion, or a freshly prefilled prompt); a
lookup finds the longest entry prefix of a new prompt, at a 16-token block boundary, by
chained block hashes (the block's tokens and the hash of everything before it), confirmed
by comparing tokens. Least recently used entries go first once ``max_tokens`` is exceeded.

Entries are only valid for the weights that computed them: the sampler clears the cache
whenever it applies a weight update, so a reused key/value was always produced by the
version that every new token is tagged with.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

BLOCK = 16  # tokens per hashed block; prefixes are reused in whole blocks


class Shared:
    """KV storage that several entries are views of (one gather for rows finishing
    together): its `tokens` count against ``max_tokens`` until its last entry goes."""

    __slots__ = ("entries", "tokens")

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.entries = 0


@dataclass
class PrefixEntry:
    tokens: tuple[int, ...]
    kv: list[tuple[Tensor, Tensor]]  # per layer: keys, values [kv_heads, len(tokens), head_dim]
    hashes: list[int]
    shared: Shared | None = None  # storage shared with other entries, if any


def block_hashes(tokens: Sequence[int]) -> list[int]:
    """``out[j]`` identifies ``tokens[: (j + 1) * BLOCK]`` (chained over the blocks)."""
    out, h = [], 0
    for end in range(BLOCK, len(tokens) + 1, BLOCK):
        h = hash((h, tuple(tokens[end - BLOCK : end])))
        out.append(h)
    return out


class PrefixCache:
    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 0:
            raise ValueError(f"prefix_cache_tokens must be >= 0 (got {max_tokens})")
        self.max_tokens = max_tokens
        self._entries: OrderedDict[int, PrefixEntry] = OrderedDict()
        self._index: dict[int, int] = {}  # block hash -> id of the newest entry holding it
        self._next_id = 0
        self.tokens = 0
        self.hits = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, tokens: Sequence[int]) -> tuple[int, PrefixEntry | None]:
        """(reusable length, entry): the longest cached block-aligned prefix of `tokens`,
        kept at least one token short of `tokens` (the last one must be forwarded)."""
        hashes = block_hashes(tokens[: len(tokens) - 1])
        for j in range(len(hashes) - 1, -1, -1):
            entry_id = self._index.get(hashes[j])
            if entry_id is None:
                continue
            entry = self._entries[entry_id]
            n = (j + 1) * BLOCK
            if entry.tokens[:n] == tuple(tokens[:n]):  # a hash collision fails here
                self._entries.move_to_end(entry_id)
                self.hits += 1
                self.reused_tokens += n
                return n, entry
        return 0, None

    def wanted(self, tokens: Sequence[int]) -> int:
        """How many tokens of `tokens` an :meth:`insert` would store (whole blocks; 0 when
        none or when the cache already holds them, which then counts as a use)."""
        n = len(tokens) // BLOCK * BLOCK
        if n == 0 or n > self.max_tokens:
            return 0
        hashes = block_hashes(tokens[:n])
        newest = self._index.get(hashes[-1])
        if newest is not None and self._entries[newest].tokens[:n] == tuple(tokens[:n]):
            self._entries.move_to_end(newest)  # already held (a sibling's identical prompt)
            return 0
        return n

    def insert(
        self,
        tokens: Sequence[int],
        kv: list[tuple[Tensor, Tensor]],
        *,
        shared: Shared | None = None,
    ) -> None:
        """Cache `kv` (computed for `tokens`) trimmed to whole blocks, copied off the batch
        cache; with `shared`, `kv` already holds exactly the wanted blocks as views of that
        storage (no copy; the storage counts in full while any of its entries is held)."""
        n = self.wanted(tokens)
        if n == 0:
            return
        hashes = block_hashes(tokens[:n])
        if shared is None:
            kv = [(k[:, :n].clone(), v[:, :n].clone()) for k, v in kv]  # off the batch cache
            self.tokens += n
        else:
            if shared.entries == 0:
                self.tokens += shared.tokens
            shared.entries += 1
        entry = PrefixEntry(tuple(tokens[:n]), kv, hashes, shared)
        entry_id, self._next_id = self._next_id, self._next_id + 1
        self._entries[entry_id] = entry
        for h in hashes:
            self._index[h] = entry_id
        while self.tokens > self.max_tokens:
            self._evict()

    def clear(self) -> None:
        self._entries.clear()
        self._index.clear()
        self.tokens = 0

    def _evict(self) -> None:
        entry_id, entry = self._entries.popitem(last=False)
        if entry.shared is None:
            self.tokens -= len(entry.tokens)
        else:
            entry.shared.entries -= 1
            if entry.shared.entries == 0:  # its storage is freed now
                self.tokens -= entry.shared.tokens
        for h in entry.hashes:
            if self._index.get(h) == entry_id:
                del self._index[h]
