"""Fixed-slot KV cache and static-shape decode step for the hf sampler (``kv_cache=static``).

The eager decode step of a transformers model costs hundreds of small kernel launches and
their Python: on a GPU, a ~0.5B Llama's step is bound by the host (~16 ms at 1 and at 128
rows on an H200), not by the GPU. A CUDA graph replays the whole forward as one launch, but
it needs every tensor it touches at a fixed address with a fixed shape. This module gives
the decode step that shape:

* **Slots**: per layer, keys and values live in one preallocated buffer
  ``[max_batch_size, kv_heads, capacity, head_dim]``. The sampler's active rows occupy the
  first slots, left-padded to a common length exactly as in the eager path (rows aligned on
  their last token, one write column for all). A decode step writes every row's new
  key/value at that column with ``index_copy_`` (the column is a device tensor, so the write
  is part of a graph).
* **Fixed-shape inputs**: token ids and positions in one ``[2, max_batch_size]`` buffer,
  an additive attention mask ``[max_batch_size, 1, 1, capacity]`` (0 where a row may
  attend, the dtype's minimum elsewhere) kept up to date on the device: one column is
  opened per step; rows joining or leaving rebuild it.
* **Buckets**: a step runs on ``b`` slots (the active rows rounded up to 1, 2, 4, ... or
  ``max_batch_size``) and ``L`` columns (the length rounded up to a power of two from 64,
  or the capacity), so a handful of shapes cover a whole run; the slots past the active
  rows compute junk that nothing reads. Attention over ``L`` columns only reads what the
  rows can see plus masked columns, never the whole capacity.
* **CUDA graphs** (:class:`SlotCache` with ``graphs=True``): the first step of each
  ``(b, L)`` bucket runs eagerly twice (warm-up, on a side stream), is captured into a
  ``torch.cuda.CUDAGraph`` and from then on replayed. The graph reads the model's
  parameters in place, so a weight update must write into the same storage (the hf sampler
  does: ``copy_``). A capture that fails is logged once, counted, and that step and every
  later one run eagerly.

Capacity is the sampler's ``max_context``: a row never holds more than that (it finishes
with ``length``), and the sampler keeps the rows' common padding at zero, so the write
column never passes it. Everything here also runs eagerly on the CPU (same buckets, same
buffers): the tests compare it with the growing cache there.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers.cache_utils import Cache

from agentrl.models import cache_kwargs

log = logging.getLogger(__name__)

MIN_LENGTH_BUCKET = 64


def batch_bucket(n: int, slots: int) -> int:
    """The smallest power of two >= `n`, at most `slots`."""
    return min(slots, 1 << max(0, n - 1).bit_length())


def length_bucket(n: int, capacity: int) -> int:
    """The smallest power of two >= `n` (at least 64), at most `capacity`."""
    return min(capacity, max(MIN_LENGTH_BUCKET, 1 << max(0, n - 1).bit_length()))


class _Layer:
    """What the sampler reads of a layer: ``keys`` / ``values`` of the active rows,
    ``[rows, kv_heads, length, head_dim]`` views of the slots."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys = keys
        self.values = values


class _StepCache(Cache):
    """The cache one static decode forward sees: ``update`` writes the new keys/values of
    slots ``:b`` at the write column and returns their first ``L`` columns."""

    def __init__(self, slots: SlotCache, b: int, length: int) -> None:
        super().__init__(layers=[_Layer(k[:b, :, :length], v[:b, :, :length]) for k, v in slots.kv])
        self._slots = slots
        self._b = b
        self._length = length

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        *_: Any,
        **__: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self._slots.kv[layer_idx]
        column = self._slots.column
        keys[: self._b].index_copy_(2, column, key_states.to(keys.dtype))
        values[: self._b].index_copy_(2, column, value_states.to(values.dtype))
        layer = self.layers[layer_idx]
        return layer.keys, layer.values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._length

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self._length, 0


class SlotCache:
    """Preallocated keys/values of `slots` rows of up to `capacity` positions (created at
    the first merge, from the prefill cache's shapes and dtype), the static decode inputs,
    and the captured graphs."""

    def __init__(self, slots: int, capacity: int, device: torch.device, *, graphs: bool) -> None:
        self.slots = slots
        self.capacity = capacity
        self.device = device
        self.graphs = graphs
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.rows = 0  # active rows, in slots :rows
        self.length = 0  # columns in use (the sampler's cache_len)
        self._mask_dirty = True
        self.inputs = torch.zeros(2, slots, dtype=torch.long, device=device)  # ids, positions
        self.column = torch.zeros(1, dtype=torch.long, device=device)
        self.mask: torch.Tensor | None = None
        self._graphs: dict[tuple[int, int], tuple[Any, torch.Tensor]] = {}
        self._pool: Any = None
        self.captured = 0
        self.replays = 0
        self.capture_failures = 0

    # --- what the sampler's bookkeeping reads ------------------------------------------

    @property
    def layers(self) -> list[_Layer]:
        return [
            _Layer(k[: self.rows, :, : self.length], v[: self.rows, :, : self.length])
            for k, v in self.kv
        ]

    def _allocate(self, like: Any) -> None:
        self.kv = []
        for layer in like.layers:
            k, v = layer.keys, layer.values
            shape = (self.slots, k.shape[1], self.capacity, k.shape[3])
            # zeros, not empty: masked columns are multiplied by 0 and must not hold NaN
            self.kv.append(
                (
                    torch.zeros(shape, dtype=k.dtype, device=self.device),
                    torch.zeros((*shape[:3], v.shape[3]), dtype=v.dtype, device=self.device),
                )
            )
        self.mask = torch.zeros(
            self.slots, 1, 1, self.capacity, dtype=like.layers[0].keys.dtype, device=self.device
        )

    # --- rows joining and leaving (eager, between decode steps) ------------------------

    def reset(self) -> None:
        self.rows, self.length, self._mask_dirty = 0, 0, True

    def merge(self, new: Any, length: int) -> tuple[int, int]:
        """Add the rows of prefill cache `new` (`length` left-padded columns) behind the
        active ones: (columns the old rows shift right, columns the new rows shift right)."""
        if not self.kv:
            self._allocate(new)
        m = new.layers[0].keys.shape[0]
        grow_old, grow_new = max(0, length - self.length), max(0, self.length - length)
        total = max(self.length, length)
        if self.rows + m > self.slots:
            raise ValueError(f"{self.rows + m} rows do not fit {self.slots} slots")
        if total > self.capacity:
            raise ValueError(f"{total} positions do not fit the static cache's {self.capacity}")
        for (keys, values), layer in zip(self.kv, new.layers, strict=True):
            for buf, src in ((keys, layer.keys), (values, layer.values)):
                if grow_old and self.rows:
                    old = buf[: self.rows, :, : self.length].clone()
                    buf[: self.rows, :, grow_old : grow_old + self.length] = old
                buf[self.rows : self.rows + m, :, grow_new : grow_new + length] = src
        self.rows += m
        self.length = total
        self._mask_dirty = True
        return grow_old, grow_new

    def keep(self, index: torch.Tensor, trim: int) -> None:
        """Keep the rows of `index` (in that order) in the first slots, dropping the first
        `trim` columns (padding in every kept row)."""
        n = int(index.numel())
        for keys, values in self.kv:
            for buf in (keys, values):
                kept = buf[: self.rows, :, trim : self.length].index_select(0, index)
                buf[:n, :, : self.length - trim] = kept
        self.rows, self.length = n, self.length - trim
        self._mask_dirty = True

    # --- the decode step ---------------------------------------------------------------

    def decode(self, model: Any, pending: list[int], pads: list[int]) -> torch.Tensor:
        """Write the rows' pending tokens at column ``length`` and return their next-token
        logits ``[rows, vocab]`` (the rows' length grows by one)."""
        n = len(pending)
        if n != self.rows:
            raise ValueError(f"{n} pending tokens for {self.rows} rows")
        if self.length + 1 > self.capacity:
            raise ValueError(
                f"the static KV cache holds {self.capacity} positions and this step needs "
                f"{self.length + 1}: raise the sampler's max_context"
            )
        assert self.mask is not None
        host = torch.tensor([pending, [self.length - p for p in pads]], dtype=torch.long)
        self.inputs[:, :n].copy_(host)
        self.column.fill_(self.length)
        if self._mask_dirty:
            columns = torch.arange(self.capacity, device=self.device)
            start = torch.tensor(pads, device=self.device).unsqueeze(-1)
            seen = (columns >= start) & (columns <= self.length)
            self.mask.zero_()  # slots past the rows attend everything: junk, but finite
            self.mask[:n, 0, 0].masked_fill_(~seen, torch.finfo(self.mask.dtype).min)
            self._mask_dirty = False
        else:
            self.mask[:n, 0, 0, self.length] = 0.0
        b = batch_bucket(n, self.slots)
        length = length_bucket(self.length + 1, self.capacity)
        logits = self._graph_step(model, b, length) if self.graphs else None
        if logits is None:
            logits = self._forward(model, b, length)
        self.length += 1
        return logits[:n, -1, :]

    def _forward(self, model: Any, b: int, length: int) -> torch.Tensor:
        assert self.mask is not None
        cache = _StepCache(self, b, length)
        with torch.inference_mode():
            out = model(
                input_ids=self.inputs[0, :b].unsqueeze(-1),
                position_ids=self.inputs[1, :b].unsqueeze(-1),
                attention_mask=self.mask[:b, :, :, :length],
                use_cache=True,
                logits_to_keep=1,
                **cache_kwargs(model, cache),
            )
        return out.logits

    def _graph_step(self, model: Any, b: int, length: int) -> torch.Tensor | None:
        """Replay (capturing first) the graph of bucket ``(b, length)``; None once capture
        has failed (the caller runs the step eagerly)."""
        if self.capture_failures:
            return None
        with torch.cuda.device(self.device):  # the model's GPU, whichever is current
            return self._replay(model, b, length)

    def _replay(self, model: Any, b: int, length: int) -> torch.Tensor | None:
        key = (b, length)
        if key not in self._graphs:
            try:
                self._graphs[key] = self._capture(model, b, length)
            except Exception as e:  # any capture error: logged, then eager
                self.capture_failures += 1
                log.warning(
                    "hf sampler: CUDA graph capture failed for %d rows x %d positions "
                    "(%s: %s); decoding eagerly from now on",
                    b,
                    length,
                    type(e).__name__,
                    e,
                )
                return None
            self.captured += 1
        graph, logits = self._graphs[key]
        graph.replay()
        self.replays += 1
        return logits

    def _capture(self, model: Any, b: int, length: int) -> tuple[Any, torch.Tensor]:
        # warm-up on a side stream (what capture requires); it computes this very step,
        # so its cache writes are the ones the replay repeats
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward(model, b, length)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA work of other threads (a learner thread, a weight swap) does not
        # break the capture
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            logits = self._forward(model, b, length)
        return graph, logits
