"""The hf sampler's weight swaps: what the rows in flight do when new weights arrive.

New weights arrive between two forward passes. What happens to the rows in flight is the
``on_update`` option (:data:`ON_UPDATE`):

* ``keep`` (partial rollouts): the rows continue on the new weights with the keys/values
  their context got from the old ones, so a token sampled after the swap comes from a mix of
  both versions (tagged with the new one). No extra work.
* ``reprefill`` (AReaL's interruptible generation): every row's cache is dropped and its
  whole context (prompt + tokens so far) is prefilled again under the new weights, in
  batched chunks of ``prefill_tokens``, before decoding goes on; a token sampled after the
  swap is exactly what the new weights give for its context. Costs one prefill of every
  in-flight context per update (``benchmarks/interruptible.py``).
* ``drain``: the swap waits until the rows in flight finish on the old weights, and new
  requests wait for the swap (strictly on-policy).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from agentrl.errors import WeightUpdateError
from agentrl.samplers.batch_kv import BatchKV
from agentrl.samplers.hf_requests import Plan, Request, Update, fail_chunk, resolve
from agentrl.samplers.precision import load_weights
from agentrl.samplers.prefix_cache import BLOCK, PrefixCache

ON_UPDATE = ("keep", "reprefill", "drain")  # what in-flight rows do on a weight update


class WeightSwaps:
    """Applying queued weight updates between two forward passes, by the ``on_update``
    policy (a part of :class:`~agentrl.samplers.hf.HFSampler`; runs on its worker thread)."""

    # the sampler's state these methods read and write
    on_update: str
    _cond: threading.Condition
    _updates: deque[Update]
    _active: list[Request]
    _pads: list[int]
    _pending: list[int]
    _kv: BatchKV
    _prefix: PrefixCache
    _model: Any
    weight_precision: str
    _quantized: frozenset[str]  # weights requantized on an update (sampler.weight_precision)
    _share: bool  # parameters re-pointed at the published tensors (share_weights_from)
    _version: int
    _reprefilled: int
    _reprefills: int
    _reprefill_s: float

    def _apply_updates(self) -> None:
        with self._cond:
            if not self._updates or (self.on_update == "drain" and self._active):
                return
            updates, self._updates = list(self._updates), deque()
        live = [u for u in updates if not u.cancelled]
        if not live:
            return
        # only the newest queued version is copied in; no token was produced by the others
        update = live[-1]
        try:
            load_weights(
                self._model, update.state, self.weight_precision, self._quantized, self._share
            )
            with self._cond:
                self._version = update.version
            self._prefix.clear()  # keys/values of the old weights
            for done in live:
                resolve(done.future, done.loop, None)
        except Exception as e:
            error = WeightUpdateError(f"applying weights failed: {e}")
            for done in live:
                resolve(done.future, done.loop, error)
            return
        if self.on_update == "reprefill":
            t0 = time.perf_counter()
            self._reprefill()
            self._reprefill_s += time.perf_counter() - t0

    def _reprefill(self) -> None:
        """Interruptible generation: rebuild every in-flight row's keys/values under the
        weights just loaded, then let decoding go on.

        A row's cache holds its prompt and every sampled token but the last (the pending one,
        fed by the next decode step), so that context is prefilled again, in chunks of
        ``prefill_tokens``; the pending tokens stay as sampled (by the old weights, tagged
        so). Prompts that several rows share (a GRPO group) are forwarded once first and
        reused through the prefix cache when it is on."""
        self._drop_cancelled()
        rows, pending = self._active, self._pending
        if not rows:
            return
        with self._cond:
            self._active = []
            self._reprefills += 1
        self._pads, self._pending = [], []
        self._kv.reset()
        contexts = [r.prompt + r.tokens[:-1] for r in rows]
        for r, context in zip(rows, contexts, strict=True):
            r.reprefilled += len(context)
        if self._prefix.max_tokens:
            counts: dict[tuple[int, ...], int] = {}
            for r in rows:
                counts[tuple(r.prompt)] = counts.get(tuple(r.prompt), 0) + 1
            shared: list[Plan] = [
                (r, r.prompt, 0, None)
                for r in rows
                if len(r.prompt) > BLOCK and counts.pop(tuple(r.prompt), 0) > 1
            ]
            for chunk in self._chunks(shared):  # only fills the prefix cache
                try:
                    self._reprefilled += self._forward(chunk)[4]
                except Exception:  # the rows' own prefill below forwards these prompts
                    break
        plans = [
            (r, context, *self._prefix.lookup(context))
            for r, context in zip(rows, contexts, strict=True)
        ]
        token_of = {id(r): t for r, t in zip(rows, pending, strict=True)}
        for chunk in self._chunks(plans):
            try:
                cache, pads, length, _, forwarded = self._forward(chunk)
                self._reprefilled += forwarded
                requests = [p[0] for p in chunk]
                for r in requests:
                    r.kv_version = self._version
                self._merge(requests, cache, pads, length, [token_of[id(r)] for r in requests])
            except Exception as e:  # these rows left the batch: fail them here
                fail_chunk(chunk, "re-prefill", e)

    if TYPE_CHECKING:  # provided by the sampler

        def _drop_cancelled(self) -> None: ...
        def _chunks(self, plans: list[Plan]) -> list[list[Plan]]: ...
        def _forward(self, chunk: list[Plan]) -> tuple[Any, list[int], int, Any, int]: ...
        def _merge(
            self, chunk: list[Request], cache: Any, pads: list[int], length: int, tokens: list[int]
        ) -> None: ...
