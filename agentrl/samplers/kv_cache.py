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

    def _owns(self, keys: torch.Tensor, new: torch.Tensor) -> bool:
        """Whether `keys` is still the leading slice of this layer's buffer, with room for
        `new` behind it."""
        buf = self._kbuf
        return (
            buf is not None
            and keys.data_ptr() == buf.data_ptr()
            and keys.shape[:2] == new.shape[:2] == buf.shape[:2]
            and keys.stride() == buf.stride()
            and keys.shape[-2] + new.shape[-2] <= buf.shape[-2]
        )

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys, values = self.keys, self.values
        length = keys.shape[-2] if keys.dim() == 4 else 0
        n = key_states.shape[-2]
        if not (length and self._owns(keys, key_states)):
            b, h, _, d = key_states.shape
            shape = (b, h, length + n + HEADROOM, d)
            kbuf = key_states.new_empty(shape)
            vbuf = value_states.new_empty((*shape[:3], value_states.shape[-1]))
            if length:
                kbuf[:, :, :length] = keys
                vbuf[:, :, :length] = values
            self._kbuf, self._vbuf = kbuf, vbuf
        assert self._kbuf is not None and self._vbuf is not None
        self._kbuf[:, :, length : length + n] = key_states
        self._vbuf[:, :, length : length + n] = value_states
        self.keys = self._kbuf[:, :, : length + n]
        self.values = self._vbuf[:, :, : length + n]
        return self.keys, self.values


class GrowingCache(Cache):
    """A cache of :class:`GrowingLayer` s, created as the model first writes each layer."""

    def __init__(self) -> None:
        super().__init__(layer_class_to_replicate=GrowingLayer)
