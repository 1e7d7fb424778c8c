"""A transformers KV cache whose appends write in place.

transformers' ``DynamicCache`` appends a decode step's keys/values with ``torch.cat``, so
every step copies the whole cache of every layer: O(context) work per generated token
(``benchmarks/kv_cache.py`` compares the two caches). :class:`GrowingCache` keeps each
layer's keys/values in a buffer with spare positions and writes new ones into it; the
buffer grows by :data:`HEADROOM` positions at a time, so a copy happens once per
``HEADROOM`` steps instead of every step (the spare positions cost ``HEADROOM`` tokens of
KV per row: 94 MB for 64 rows of SmolLM2-135M in bf16).

The layer's ``keys`` / ``values`` stay ordinary ``[batch, heads, length, head_dim]``
tensors (views of the buffer), so code that reads them, or replaces them (the hf sampler
drops finished rows and merges new ones that way), works unchanged: a replaced tensor is
copied into a fresh buffer at the next append.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

HEADROOM = 64  # spare positions a buffer gets when it is (re)allocated


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose appends write into a preallocated buffer."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None

    def _owns(self, keys: torch.Tensor, lead: tuple[int, ...], n: int) -> bool:
        """Whether `keys` is still the leading slice of this layer's buffer, with room for
        `n` more positions of `lead` ``(batch, heads)`` behind it."""
        buf = self._kbuf
        return (
            buf is not None
            and keys.data_ptr() == buf.data_ptr()
            and tuple(keys.shape[:2]) == tuple(lead) == tuple(buf.shape[:2])
            and keys.stride() == buf.stride()
            and keys.shape[-2] + n <= buf.shape[-2]
        )

    def _grow(self, like_k: torch.Tensor, like_v: torch.Tensor, length: int, n: int) -> None:
        """Fresh buffers for ``length + n`` positions (and the headroom), the current
        keys/values copied into their first `length`."""
        b, h, _, d = like_k.shape
        shape = (b, h, length + n + HEADROOM, d)
        kbuf = like_k.new_empty(shape)
        vbuf = like_v.new_empty((*shape[:3], like_v.shape[-1]))
        if length:
            kbuf[:, :, :length] = self.keys
            vbuf[:, :, :length] = self.values
        self._kbuf, self._vbuf = kbuf, vbuf

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys = self.keys
        length = keys.shape[-2] if keys.dim() == 4 else 0
        n = key_states.shape[-2]
        if not (length and self._owns(keys, key_states.shape[:2], n)):
            self._grow(key_states, value_states, length, n)
        assert self._kbuf is not None and self._vbuf is not None
        self._kbuf[:, :, length : length + n] = key_states
        self._vbuf[:, :, length : length + n] = value_states
        self.advance(n)
        return self.keys, self.values

    def advance(self, n: int) -> None:
        """Take the `n` positions written behind the current keys/values into them."""
        assert self._kbuf is not None and self._vbuf is not None
        length = (self.keys.shape[-2] if self.keys.dim() == 4 else 0) + n
        self.keys = self._kbuf[:, :, :length]
        self.values = self._vbuf[:, :, :length]


def release_buffers(layer: Any) -> None:
    """Let go of a :class:`GrowingLayer`'s buffer once its keys/values were replaced by new
    tensors (the batch's rows merged or dropped): the next append copies them into a fresh
    one anyway, and holding the old one until then kept two copies of the cache at once.
    Other layers have no buffer of their own."""
    if isinstance(layer, GrowingLayer):
        layer._kbuf = layer._vbuf = None


class GrowingCache(Cache):
    """A cache of :class:`GrowingLayer` s, created as the model first writes each layer."""

    def __init__(self) -> None:
        super().__init__(layer_class_to_replicate=GrowingLayer)


def _dynamic_cache() -> Cache:
    from transformers import DynamicCache

    return DynamicCache()


# the hf sampler's ``kv_cache`` option: a new, empty cache of each kind
KV_CACHES: dict[str, Callable[[], Cache]] = {"growing": GrowingCache, "dynamic": _dynamic_cache}
