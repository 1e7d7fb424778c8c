"""The hf sampler's running batch of keys/values: one interface over its ``kv_cache`` modes.

Every mode keeps the active rows left-padded to a common length ``length`` (rows aligned on
their last token); the sampler keeps each row's pad count and never asks which mode it has:

* ``growing`` / ``dynamic`` (:class:`EagerBatch`): a transformers cache (:mod:`.kv_cache`'s
  in-place :class:`~agentrl.samplers.kv_cache.GrowingCache`, or ``DynamicCache``) whose
  tensors are concatenated when rows join and index-selected when rows leave; the decode
  step is the model's eager forward.
* ``static`` (:class:`~agentrl.samplers.static_cache.SlotCache`): fixed slots and a
  static-shape decode step that CUDA graphs can replay.

Prefills always produce an eager cache (``new_prefill_cache``); :meth:`BatchKV.merge` adds
its rows behind the active ones in whatever layout the mode keeps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from transformers.cache_utils import Cache

from agentrl.models import cache_kwargs, returned_cache
from agentrl.samplers.kv_cache import KV_CACHES, release_buffers
from agentrl.samplers.static_cache import SlotCache

KV_CACHE_MODES = (*KV_CACHES, "static")  # the hf sampler's ``kv_cache`` option


class BatchKV(Protocol):
    """Keys/values of the active rows, left-padded to ``length`` columns."""

    length: int
    captured: int  # decode-step CUDA graphs captured (0 where the mode has none)
    replays: int
    capture_failures: int

    @property
    def layers(self) -> list[Any]:
        """Per layer, ``keys`` / ``values`` ``[rows, kv_heads, length, head_dim]``."""
        ...

    def reset(self) -> None:
        """No rows."""

    def merge(self, new: Any, length: int) -> tuple[int, int]:
        """Add the rows of prefill cache `new` (`length` left-padded columns) behind the
        active ones: (columns the old rows shift right, columns the new rows shift right)."""
        ...

    def keep(self, index: torch.Tensor, trim: int) -> None:
        """Keep the rows of `index`, in that order, dropping the first `trim` columns."""

    def decode(self, model: Any, pending: list[int], pads: list[int]) -> torch.Tensor:
        """Feed each row its pending token: next-token logits ``[rows, vocab]``; ``length``
        grows by one."""
        ...


class EagerBatch:
    """The rows in one transformers cache, decoded by the model's eager forward."""

    captured = replays = capture_failures = 0

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self.cache: Any = None
        self.length = 0

    @property
    def layers(self) -> list[Any]:
        return self.cache.layers

    def reset(self) -> None:
        self.cache, self.length = None, 0

    def merge(self, new: Any, length: int) -> tuple[int, int]:
        if self.cache is None:
            self.cache, self.length = new, length
            return 0, 0
        grow_old, grow_new = max(0, length - self.length), max(0, self.length - length)
        for old, layer in zip(self.cache.layers, new.layers, strict=True):
            old.keys = torch.cat([left_pad(old.keys, grow_old), left_pad(layer.keys, grow_new)], 0)
            old.values = torch.cat(
                [left_pad(old.values, grow_old), left_pad(layer.values, grow_new)], 0
            )
            release_buffers(old)  # its former storage goes now, not at its next append
        self.length = max(self.length, length)
        return grow_old, grow_new

    def keep(self, index: torch.Tensor, trim: int) -> None:
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[..., trim:, :]
            layer.values = layer.values.index_select(0, index)[..., trim:, :]
            release_buffers(layer)
        self.length -= trim

    def decode(self, model: Any, pending: list[int], pads: list[int]) -> torch.Tensor:
        # ids, positions and (when rows are padded) the pads: one host-to-device copy
        rows = [pending, [self.length - p for p in pads]]
        padded = any(pads)
        if padded:
            rows.append(pads)
        inputs = torch.tensor(rows).to(self._device)
        mask = None
        if padded:
            columns = torch.arange(self.length + 1, device=self._device)
            mask = (columns >= inputs[2].unsqueeze(-1)).long()
        with torch.inference_mode():
            out = model(
                input_ids=inputs[0].unsqueeze(-1),
                attention_mask=mask,
                position_ids=inputs[1].unsqueeze(-1),
                use_cache=True,
                logits_to_keep=1,
                **cache_kwargs(model, self.cache),
            )
        self.cache = returned_cache(out)
        self.length += 1
        return out.logits[:, -1, :]


def batch_kv(
    mode: str, device: torch.device, *, slots: int, capacity: int, graphs: bool
) -> tuple[BatchKV, Callable[[], Cache]]:
    """The running batch for ``kv_cache=mode`` and the factory of the caches prefills fill."""
    if mode not in KV_CACHE_MODES:
        raise ValueError(f"kv_cache must be one of {', '.join(KV_CACHE_MODES)} (got {mode!r})")
    if mode == "static":  # prefills go through the growing cache, merged into the slots
        return SlotCache(slots, capacity, device, graphs=graphs), KV_CACHES["growing"]
    return EagerBatch(device), KV_CACHES[mode]


def left_pad(t: torch.Tensor, n: int) -> torch.Tensor:
    """`t` with `n` zero columns before its positions (dim -2)."""
    if n == 0:
        return t
    shape = list(t.shape)
    shape[-2] = n
    return torch.cat([t.new_zeros(shape), t], dim=-2)
