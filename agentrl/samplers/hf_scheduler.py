"""The hf sampler's scheduler: the worker thread's continuous-batching loop.

Between two forward passes the loop applies pending weight updates
(:mod:`agentrl.samplers.hf_swap`), drops cancelled requests, admits newcomers up to
``max_batch_size`` rows, prefills them in chunks of ``prefill_tokens``
(:mod:`agentrl.samplers.hf_prefill`) and merges them into the running batch; then one decode
step advances every active row by one token and finished rows leave the batch (their KV is
remembered by the prefix cache). The KV cache itself is :mod:`agentrl.samplers.batch_kv`.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch

from agentrl.errors import SamplerError, WeightUpdateError
from agentrl.samplers import hf_prefill
from agentrl.samplers.batch_kv import BatchKV
from agentrl.samplers.hf_requests import (
    Plan,
    Request,
    Update,
    aborted,
    fail_chunk,
    finish_reason,
    generation,
    resolve,
)
from agentrl.samplers.prefix_cache import PrefixCache
from agentrl.samplers.sampling import sample_next
from agentrl.weights.gate import WeightGate


class BatchScheduler:
    """The worker thread's loop over the batch (a part of
    :class:`~agentrl.samplers.hf.HFSampler`; the event loop only calls :meth:`_submit`)."""

    # the sampler's state these methods read and write
    on_update: str
    max_batch_size: int
    max_context: int
    prefill_tokens: int
    _model: Any
    _tokenizer: Any
    _device: torch.device
    _new_cache: Any
    _cond: threading.Condition
    _waiting: deque[Request]
    _updates: deque[Update]
    _closed: bool
    _thread: threading.Thread | None
    _active: list[Request]
    _pads: list[int]
    _pending: list[int]
    _kv: BatchKV
    _prefix: PrefixCache
    _rng: torch.Generator
    _version: int
    _steps: int
    _tokens_out: int
    _prefilled: int
    _gate: WeightGate | None
    _pass_version: int  # the version of the weights the last forward pass saw (a gate)

    _apply_updates: Callable[[], None]  # hf_swap.WeightSwaps

    def _submit(self, request: Request | None = None, update: Update | None = None) -> None:
        with self._cond:
            if self._closed:
                raise SamplerError("the hf sampler is closed; create a new one")
            if request is not None:
                self._waiting.append(request)
            if update is not None:
                self._updates.append(update)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="agentrl-hf-sampler", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not (self._waiting or self._updates or self._active):
                    self._cond.wait()
                if self._closed:
                    break
            try:
                self._iteration()
            except Exception as e:  # a failed forward fails the requests in it, not the loop
                self._fail_active(SamplerError(f"hf sampler step failed: {type(e).__name__}: {e}"))
        self._fail_active(SamplerError("the hf sampler was closed during generation"))
        with self._cond:
            waiting, self._waiting = list(self._waiting), deque()
            updates, self._updates = list(self._updates), deque()
        for r in waiting:
            resolve(
                r.future, r.loop, SamplerError("the hf sampler was closed before this request ran")
            )
        for u in updates:
            resolve(
                u.future, u.loop, WeightUpdateError("the hf sampler was closed before the update")
            )

    def _iteration(self) -> None:
        self._apply_updates()
        self._drop_cancelled()
        plans = [(r, r.prompt, *self._prefix.lookup(r.prompt)) for r in self._admit()]
        for chunk in self._chunks(plans):
            try:
                self._prefill(chunk)
            except Exception as e:  # these callers are not in the batch yet: fail them here
                fail_chunk(chunk, "prefill", e)
        if self._active:
            self._decode_step()
        elif not self._waiting and self._updates:
            self._apply_updates()

    def _chunks(self, plans: list[Plan]) -> list[list[Plan]]:
        return hf_prefill.chunks(plans, self.prefill_tokens)

    def _admit(self) -> list[Request]:
        with self._cond:
            if self.on_update == "drain" and self._updates:
                return []  # strictly on-policy: new requests wait for the new weights
            free = self.max_batch_size - len(self._active)
            admitted = []
            while self._waiting and free > 0:
                request = self._waiting.popleft()
                if request.cancelled:
                    resolve(request.future, request.loop, aborted(request))
                    continue
                admitted.append(request)
                free -= 1
        return admitted

    def _drop_cancelled(self) -> None:
        keep = [i for i, r in enumerate(self._active) if not r.cancelled]
        if len(keep) == len(self._active):
            return
        dropped = [r for r in self._active if r.cancelled]
        self._keep_rows(keep)
        for r in dropped:
            resolve(r.future, r.loop, aborted(r))

    def _keep_rows(self, keep: list[int]) -> None:
        with self._cond:
            self._active = [self._active[i] for i in keep]
        self._pads = [self._pads[i] for i in keep]
        self._pending = [self._pending[i] for i in keep]
        if not keep:
            self._kv.reset()
            return
        trim = min(self._pads)
        self._kv.keep(torch.tensor(keep, device=self._device), trim)
        self._pads = [p - trim for p in self._pads]

    def _prefill(self, chunk: list[Plan]) -> None:
        """Prefill new requests, sample their first tokens and add them to the batch."""
        cache, pads, length, logits, forwarded = self._forward(chunk)
        self._prefilled += forwarded
        requests = [p[0] for p in chunk]
        for r in requests:
            r.kv_version = self._version
        tokens = self._sample(requests, logits)
        self._merge(requests, cache, pads, length, tokens)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """Around a forward pass: the learner does not change weights this sampler computes
        on while it runs, and the tokens sampled from it are tagged with those weights'
        version (share_weights_from with a gate; a no-op otherwise)."""
        if self._gate is None:
            yield
            return
        with self._gate.reading() as version:
            # a publish may lag the weights (tagged by it) or run ahead of a skipped step
            self._pass_version = max(version, self._version)
            yield

    def _forward(self, chunk: list[Plan]) -> tuple[Any, list[int], int, torch.Tensor, int]:
        """(cache, left pads, padded length, last logits, tokens forwarded) of a prefill."""
        with self._reading():
            return hf_prefill.forward(
                self._model,
                chunk,
                new_cache=self._new_cache,
                prefix=self._prefix,
                device=self._device,
            )

    def _merge(
        self, chunk: list[Request], cache: Any, pads: list[int], length: int, tokens: list[int]
    ) -> None:
        grow_old, grow_new = self._kv.merge(cache, length)
        self._pads = [p + grow_old for p in self._pads] + [p + grow_new for p in pads]
        with self._cond:
            self._active.extend(chunk)
        self._pending.extend(tokens)
        self._finish_rows()

    def _decode_step(self) -> None:
        with self._reading():
            logits = self._kv.decode(self._model, self._pending, self._pads)
        self._decoded(logits)

    def _decoded(self, logits: torch.Tensor) -> None:
        """Sample the rows' next tokens from a decode step's `logits`."""
        with self._cond:
            self._steps += 1
        self._pending = self._sample(self._active, logits)
        self._finish_rows()

    def _sample(self, rows: list[Request], logits: torch.Tensor) -> list[int]:
        """Sample one token per row and record it (with logprob, entropy, version)."""
        tokens, logprobs, entropies = sample_next(
            logits,
            [r.params for r in rows],
            [r.generator for r in rows],
            self._rng,
        )
        version = self._version if self._gate is None else self._pass_version
        for i, r in enumerate(rows):
            r.tokens.append(tokens[i])
            r.logprobs.append(logprobs[i])
            r.versions.append(version)
            if entropies is not None and r.params.return_entropy:
                r.entropies.append(entropies[i])
        with self._cond:
            self._tokens_out += len(rows)
        return tokens

    def _finish_rows(self) -> None:
        keep, done, remember = [], [], []
        for i, r in enumerate(self._active):
            reason = finish_reason(r, self._tokenizer, self.max_context)
            if reason is None and not r.cancelled:
                keep.append(i)
            else:
                r.finish = reason or "abort"
                done.append(r)
                if reason is not None and r.kv_version == self._version and not r.params.last_turn:
                    # its next turn resends this sequence; the last token is not cached yet
                    remember.append((r.prompt + r.tokens[:-1], i, self._pads[i]))
        if remember:
            hf_prefill.remember(self._prefix, remember, self._kv, self._kv.length, self._device)
        if done:
            self._keep_rows(keep)  # free the slots before the callers wake up
        for r in done:
            resolve(r.future, r.loop, generation(r, self._tokenizer, self.on_update))

    def _fail_active(self, error: Exception) -> None:
        for r in self._active:
            resolve(r.future, r.loop, error)
        with self._cond:
            self._active = []
        self._pads, self._pending = [], []
        self._kv.reset()
