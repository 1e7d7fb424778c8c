"""The embedded ``hf`` sampler: one transformers model shared by every concurrent caller.

A worker thread runs a continuous-batching loop. Between two forward passes it applies a
pending weight update, drops cancelled requests, prefills newcomers and merges them into
the running batch; then one decode step advances every active sequence by one token.
The event loop only submits requests and awaits futures, so it never blocks on compute.

KV cache: a :class:`~agentrl.samplers.kv_cache.GrowingCache` (a transformers cache whose
decode-step appends write in place instead of concatenating) holding all active rows,
left-padded to a common length. Each row keeps its own pad count; positions and the
attention mask are per row, so rows of different lengths decode together exactly (RoPE
is applied with the row's own positions before keys are cached, so padding columns never
shift anything). Finished rows are removed between steps and columns that are padding in
every row are trimmed away. With ``kv_cache=static`` the same layout lives in fixed slots
(:mod:`agentrl.samplers.static_cache`): static-shape decode steps, replayed as CUDA graphs
on a GPU (``cuda_graphs``).

Behaviour log-probs follow :mod:`agentrl.samplers.base`: ``log_softmax(logits / T)`` at the
sampled token, before top-p / top-k truncation (greedy: unscaled logits).

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

Each :class:`Generation` says which was used (``metadata["on_update"]``) and how many context
tokens were re-prefilled for it (``metadata["reprefilled_tokens"]``); the episode runner
copies both onto the trajectory's :class:`~agentrl.types.Turn`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import torch

from agentrl.devices import check_memory, resolve_device, sampler_bytes
from agentrl.errors import PromptError, SamplerError, WeightUpdateError
from agentrl.models import cache_kwargs, load_model, returned_cache
from agentrl.samplers.base import FinishReason, Generation, Sampler, SamplingParams, WeightsLike
from agentrl.samplers.kv_cache import KV_CACHES
from agentrl.samplers.options import check_options, resolve_on_update, shared_options
from agentrl.samplers.prefix_cache import BLOCK, PrefixCache, PrefixEntry, Shared
from agentrl.samplers.sampling import sample_next
from agentrl.samplers.settings import SamplerSettings
from agentrl.samplers.static_cache import SlotCache
from agentrl.weights.spec import WeightSpec

log = logging.getLogger(__name__)


ON_UPDATE = ("keep", "reprefill", "drain")  # what in-flight rows do on a weight update
CUDA_GRAPHS = ("auto", "on", "off")  # decode steps replayed as CUDA graphs (kv_cache=static)


@dataclass(eq=False)
class _Request:
    prompt: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    generator: torch.Generator | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Generation]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    cancelled: bool = False
    finish: FinishReason | None = None
    started: float = field(default_factory=time.perf_counter)
    kv_version: int = -1  # weights its cached keys/values were computed with
    reprefilled: int = 0  # context tokens whose KV was recomputed after a weight update


# (request, the tokens to prefill, how many of them the prefix cache holds, that entry)
_Plan = tuple[_Request, list[int], int, PrefixEntry | None]


@dataclass(eq=False)
class _Update:
    state: dict[str, torch.Tensor]
    version: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]
    cancelled: bool = False


def _resolve(fut: asyncio.Future[Any], loop: asyncio.AbstractEventLoop, value: Any) -> None:
    """Complete `fut` from the worker thread (ignored when the caller already left)."""

    def _set() -> None:
        if fut.done():
            return
        if isinstance(value, BaseException):
            fut.set_exception(value)
        else:
            fut.set_result(value)

    with contextlib.suppress(RuntimeError):  # the caller's loop is closed
        loop.call_soon_threadsafe(_set)


class HFSampler(Sampler):
    """Continuous-batching sampler over a transformers causal LM (CPU or GPU).

    Options: ``max_batch_size`` (rows decoded together), ``max_context`` (default: the
    model's ``max_position_embeddings``), ``on_update`` (``keep``, ``reprefill`` or
    ``drain``: what in-flight rows do when new weights arrive, see the module doc),
    ``default_stop_token_ids``
    (default: the tokenizer's eos and ``<|im_end|>``; per-request ``stop_token_ids`` are
    added to them), ``prefill_tokens`` (token budget of one batched prefill), ``version``,
    ``prefix_cache_tokens`` (KV of earlier prompts and finished sequences kept for reuse, see
    :mod:`agentrl.samplers.prefix_cache`; 0 disables it), ``kv_cache`` (``growing``: decode
    steps append keys/values in place, :mod:`agentrl.samplers.kv_cache`; ``dynamic``:
    transformers' ``DynamicCache``, which concatenates the whole cache every step;
    ``static``: fixed slots of ``max_batch_size`` rows x ``max_context`` positions and a
    static-shape decode step, :mod:`agentrl.samplers.static_cache`), ``cuda_graphs``
    (``auto``: with ``kv_cache=static`` on a CUDA model, decode steps are captured as CUDA
    graphs and replayed; ``on``: the same, refused elsewhere; ``off``: eager).
    """

    backend = "hf"
    weight_payload = "state_dict"  # what the WeightBus hands to update_weights

    @classmethod
    def options_from_settings(cls, settings: SamplerSettings) -> dict[str, Any]:
        options = shared_options(settings)
        policy = resolve_on_update(settings, cls)
        options.update(max_batch_size=settings.max_batch_size, on_update=policy)
        return options

    @classmethod
    def from_settings(cls, settings: SamplerSettings) -> HFSampler:
        """Its own model copy on ``sampler.device`` in ``model.dtype`` (the learner keeps
        float32 masters of its own); the memory it needs is checked before it decodes."""
        options = cls.options_from_settings(settings)
        # resolved by the run layer (this parses it; auto stays usable in scripts)
        device = resolve_device(settings.device, "sampler.device")
        model, tokenizer = load_model(
            settings.model_name,
            dtype=None if settings.model_dtype == "auto" else settings.model_dtype,
            device=device,
            seed=settings.model_seed,
        )
        tokens = settings.max_tokens
        if options.get("kv_cache") == "static":  # every slot holds max_context positions
            tokens = int(
                options.get("max_context") or getattr(model.config, "max_position_embeddings", 2048)
            )
        need, what = sampler_bytes(model, settings.max_batch_size, tokens)
        check_memory(settings.gpu_memory_fraction, "sampler", need, device, what)
        check_options(cls, options)
        return cls(model, tokenizer, **options)

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 32,
        max_context: int | None = None,
        on_update: str = "keep",
        default_stop_token_ids: Sequence[int] | None = None,
        prefill_tokens: int = 4096,
        version: int = 0,
        seed: int | None = None,
        prefix_cache_tokens: int = 32768,
        kv_cache: str = "growing",
        cuda_graphs: str | bool = "auto",
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1 (got {max_batch_size})")
        if kv_cache not in (*KV_CACHES, "static"):
            raise ValueError(
                f"kv_cache must be one of {', '.join((*KV_CACHES, 'static'))} (got {kv_cache!r})"
            )
        if isinstance(cuda_graphs, bool):  # YAML reads a bare on/off as a boolean
            cuda_graphs = "on" if cuda_graphs else "off"
        if cuda_graphs not in CUDA_GRAPHS:
            raise ValueError(
                f"cuda_graphs must be one of {', '.join(CUDA_GRAPHS)} (got {cuda_graphs!r})"
            )
        if on_update not in ON_UPDATE:
            raise ValueError(f"on_update must be one of {', '.join(ON_UPDATE)} (got {on_update!r})")
        self.on_update = on_update
        self._model = model.eval()
        self._tokenizer = tokenizer
        self._device = next(model.parameters()).device
        on_cuda = self._device.type == "cuda"
        if cuda_graphs == "on" and not (kv_cache == "static" and on_cuda):
            raise ValueError(
                "cuda_graphs=on needs kv_cache=static and a model on a CUDA device (this one: "
                f"kv_cache={kv_cache}, {self._device}); set kv_cache=static, or cuda_graphs=auto/off"
            )
        self.kv_cache = kv_cache
        self.cuda_graphs = kv_cache == "static" and on_cuda and cuda_graphs != "off"
        # prefills always go through the growing cache; kv_cache=static merges them into slots
        self._new_cache = KV_CACHES["growing" if kv_cache == "static" else kv_cache]
        self._vocab = int(model.get_output_embeddings().weight.shape[0])
        self.max_batch_size = max_batch_size
        self.max_context = int(
            max_context or getattr(model.config, "max_position_embeddings", 2048)
        )
        self.prefill_tokens = max(1, prefill_tokens)
        self._slots = (
            SlotCache(max_batch_size, self.max_context, self._device, graphs=self.cuda_graphs)
            if kv_cache == "static"
            else None
        )
        if default_stop_token_ids is None:
            default_stop_token_ids = _default_stop_ids(tokenizer, model)
        self.default_stop_token_ids = frozenset(int(t) for t in default_stop_token_ids)
        self._version = version
        self._requested_version = version
        self._rng = torch.Generator(device="cpu")
        self._rng.manual_seed(seed if seed is not None else int(torch.seed() % 2**63))
        # names and shapes new weights must have (checked before anything is copied)
        self._spec = WeightSpec.from_model(model)

        self._cond = threading.Condition()
        self._waiting: deque[_Request] = deque()
        self._updates: deque[_Update] = deque()
        self._closed = False
        self._thread: threading.Thread | None = None
        # batch state, touched only by the worker thread
        self._active: list[_Request] = []
        self._pads: list[int] = []
        self._pending: list[int] = []  # sampled token of each row not yet fed to the model
        self._cache: Any = None
        self._cache_len = 0
        self._steps = 0
        self._tokens_out = 0
        self._prefix = PrefixCache(prefix_cache_tokens)
        self._prefilled = 0  # prompt tokens forwarded (reused ones excluded)
        self._reprefilled = 0  # context tokens forwarded again after weight updates
        self._reprefills = 0  # updates that re-prefilled rows in flight
        self._reprefill_s = 0.0  # time spent re-prefilling

    # --- public surface -------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def model(self) -> Any:
        return self._model

    @property
    def context_length(self) -> int:
        return self.max_context

    @property
    def vocab_size(self) -> int:
        return self._vocab

    def stats(self) -> dict[str, float]:
        """Active rows, waiting requests, decode steps and tokens produced so far."""
        with self._cond:
            return {
                "active": len(self._active),
                "waiting": len(self._waiting),
                "steps": self._steps,
                "tokens": self._tokens_out,
                "version": self._version,
                "prefill_tokens": self._prefilled,
                "prefix_reused_tokens": self._prefix.reused_tokens,
                "reprefill_tokens": self._reprefilled,
                "reprefills": self._reprefills,
                "reprefill_s": self._reprefill_s,
                "cuda_graphs": self._slots.captured if self._slots else 0,
                "graph_replays": self._slots.replays if self._slots else 0,
                "graph_fallbacks": self._slots.capture_failures if self._slots else 0,
            }

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        if params.n != 1:
            raise ValueError(
                f"generate samples one continuation; use generate_many for n={params.n}"
            )
        prompt = self._check_prompt(prompt_ids)
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device="cpu")
            generator.manual_seed(params.seed)
        loop = asyncio.get_running_loop()
        request = _Request(
            prompt=prompt,
            params=params,
            stop_ids=self.default_stop_token_ids | frozenset(params.stop_token_ids),
            generator=generator,
            loop=loop,
            future=loop.create_future(),
        )
        self._submit(request=request)
        try:
            return await request.future
        except BaseException:
            request.cancelled = True  # the worker frees the slot before its next step
            with self._cond:
                self._cond.notify_all()
            raise

    async def update_weights(self, weights: WeightsLike, version: int) -> None:
        with self._cond:
            if version <= self._requested_version:
                raise WeightUpdateError(
                    f"weight versions only go up: got {version}, sampler is at "
                    f"{self._requested_version}; publish version {self._requested_version + 1} or later"
                )
        state = await anyio.to_thread.run_sync(self._spec.validate, weights, self._version)
        loop = asyncio.get_running_loop()
        update = _Update(state=state, version=version, loop=loop, future=loop.create_future())
        with self._cond:
            if version <= self._requested_version:
                raise WeightUpdateError(
                    f"weight versions only go up: got {version}, sampler is at {self._requested_version}"
                )
            self._requested_version = version
        self._submit(update=update)
        try:
            await update.future
        except BaseException:
            update.cancelled = True
            raise

    async def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        thread = self._thread
        if thread is not None:
            await anyio.to_thread.run_sync(thread.join)

    # --- input checks ---------------------------------------------------------------

    def _check_prompt(self, prompt_ids: Sequence[int]) -> list[int]:
        if isinstance(prompt_ids, torch.Tensor):
            prompt_ids = prompt_ids.flatten().tolist()
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise PromptError(
                "prompt_ids is empty: pass at least one token (render the chat first)"
            )
        if len(prompt) >= self.max_context:
            raise PromptError(
                f"prompt has {len(prompt)} tokens but the context is {self.max_context}: shorten the "
                "prompt (rollout.max_tokens) or use a model with a longer context"
            )
        bad = [t for t in prompt if not 0 <= t < self._vocab]
        if bad:
            raise PromptError(
                f"prompt_ids contains ids outside the vocabulary [0, {self._vocab}): {bad[:5]}"
            )
        return prompt

    # --- worker ---------------------------------------------------------------------

    def _submit(self, request: _Request | None = None, update: _Update | None = None) -> None:
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
            _resolve(
                r.future, r.loop, SamplerError("the hf sampler was closed before this request ran")
            )
        for u in updates:
            _resolve(
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
                _fail_chunk(chunk, "prefill", e)
        if self._active:
            self._decode_step()
        elif not self._waiting and self._updates:
            self._apply_updates()

    def _chunks(self, plans: list[_Plan]) -> list[list[_Plan]]:
        """`plans` in prefill chunks of at most ``prefill_tokens`` (padded) tokens, sorted by
        the length left to forward so a chunk's rows need similar work."""
        plans = sorted(plans, key=lambda p: len(p[1]) - p[2])
        chunks: list[list[_Plan]] = []
        while plans:
            chunk: list[_Plan] = []
            while plans and (
                not chunk
                or (len(plans[0][1]) - plans[0][2]) * (len(chunk) + 1) <= self.prefill_tokens
            ):
                chunk.append(plans.pop(0))
            chunks.append(chunk)
        return chunks

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
            with torch.no_grad():
                params = self._model.state_dict()
                written: set[tuple[int, int]] = set()
                for name, tensor in update.state.items():
                    target = params[name]
                    key = (target.untyped_storage().data_ptr(), target.storage_offset())
                    if key in written:  # tied weights: one copy is enough
                        continue
                    written.add(key)
                    target.copy_(tensor)  # converts dtype and device in one pass
            with self._cond:
                self._version = update.version
            self._prefix.clear()  # keys/values of the old weights
            for done in live:
                _resolve(done.future, done.loop, None)
        except Exception as e:
            error = WeightUpdateError(f"applying weights failed: {e}")
            for done in live:
                _resolve(done.future, done.loop, error)
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
        self._pads, self._pending, self._cache, self._cache_len = [], [], None, 0
        contexts = [r.prompt + r.tokens[:-1] for r in rows]
        for r, context in zip(rows, contexts, strict=True):
            r.reprefilled += len(context)
        if self._prefix.max_tokens:
            counts: dict[tuple[int, ...], int] = {}
            for r in rows:
                counts[tuple(r.prompt)] = counts.get(tuple(r.prompt), 0) + 1
            shared: list[_Plan] = [
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
                _fail_chunk(chunk, "re-prefill", e)

    def _admit(self) -> list[_Request]:
        with self._cond:
            if self.on_update == "drain" and self._updates:
                return []  # strictly on-policy: new requests wait for the new weights
            free = self.max_batch_size - len(self._active)
            admitted = []
            while self._waiting and free > 0:
                request = self._waiting.popleft()
                if request.cancelled:
                    _resolve(request.future, request.loop, _abort(request))
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
            _resolve(r.future, r.loop, _abort(r))

    def _keep_rows(self, keep: list[int]) -> None:
        with self._cond:
            self._active = [self._active[i] for i in keep]
        self._pads = [self._pads[i] for i in keep]
        self._pending = [self._pending[i] for i in keep]
        if not keep:
            self._cache, self._cache_len = None, 0
            return
        index = torch.tensor(keep, device=self._device)
        trim = min(self._pads)
        if self._slots is not None:
            self._slots.keep(index, trim)
            self._pads = [p - trim for p in self._pads]
            self._cache_len -= trim
            return
        for layer in self._cache.layers:
            layer.keys = layer.keys.index_select(0, index)[..., trim:, :]
            layer.values = layer.values.index_select(0, index)[..., trim:, :]
        self._pads = [p - trim for p in self._pads]
        self._cache_len -= trim

    def _prefill(self, chunk: list[_Plan]) -> None:
        """Prefill new requests, sample their first tokens and add them to the batch."""
        cache, pads, length, logits, forwarded = self._forward(chunk)
        self._prefilled += forwarded
        requests = [p[0] for p in chunk]
        for r in requests:
            r.kv_version = self._version
        tokens = self._sample(requests, logits)
        self._merge(requests, cache, pads, length, tokens)

    def _forward(self, chunk: list[_Plan]) -> tuple[Any, list[int], int, torch.Tensor, int]:
        """Forward the plans' tokens (each distinct sequence once) on top of the cached
        prefixes: (cache, left pads, padded length, last logits, tokens forwarded), one row
        per plan.

        Rows are left-padded to the longest sequence `L`; the last `Q` positions (the longest
        part any row must forward) are fed, the first ``L - Q`` come from the prefix cache.
        A row with less left to forward re-feeds a few cached tokens instead.
        """
        distinct: dict[tuple[int, ...], int] = {}
        plans: list[_Plan] = []
        row_of = []  # the distinct sequence each plan forwards with
        for plan in chunk:
            row_of.append(distinct.setdefault(tuple(plan[1]), len(plans)))
            if row_of[-1] == len(plans):
                plans.append(plan)
        longest = max(len(t) for _, t, _, _ in plans)
        fed = max(len(t) - reused for _, t, reused, _ in plans)
        past = longest - fed
        pads = [longest - len(t) for _, t, _, _ in plans]
        ids = torch.tensor(
            [([0] * p + t)[past:] for p, (_, t, _, _) in zip(pads, plans, strict=True)],
            device=self._device,
        )
        mask = _mask(pads, longest, self._device)
        positions = (mask.cumsum(-1) - 1).clamp_(min=0)[:, past:]
        if not any(pads):
            mask = None  # no padding: the model's plain causal path is faster
        cache = self._new_cache()
        if past:
            self._seed_cache(cache, plans, pads, past)
        with torch.inference_mode():
            out = self._model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
                **cache_kwargs(self._model, cache),
            )
        cache = returned_cache(out)
        forwarded = ids.numel() - sum(max(0, p - past) for p in pads)
        self._remember(
            [(t, row, pads[row]) for row, (_, t, _, _) in enumerate(plans)], cache, longest
        )
        logits = out.logits[:, -1, :]
        if len(plans) < len(chunk):  # identical sequences (a GRPO group): one row each again
            index = torch.tensor(row_of, device=self._device)
            logits = logits.index_select(0, index)
            for layer in cache.layers:
                layer.keys = layer.keys.index_select(0, index)
                layer.values = layer.values.index_select(0, index)
        return cache, [pads[i] for i in row_of], longest, logits, int(forwarded)

    def _seed_cache(self, cache: Any, plans: list[_Plan], pads: list[int], past: int) -> None:
        """Fill `cache` with the first `past` (left-padded) positions of every row."""
        kv = next(entry.kv for _, _, _, entry in plans if entry is not None)
        for layer, (k0, v0) in enumerate(kv):
            keys = k0.new_zeros(len(plans), k0.shape[0], past, k0.shape[2])
            values = v0.new_zeros(len(plans), v0.shape[0], past, v0.shape[2])
            for row, ((_, _, _, entry), pad) in enumerate(zip(plans, pads, strict=True)):
                take = past - pad  # <= the row's reused length, by the choice of `past`
                if take > 0 and entry is not None:
                    keys[row, :, pad:] = entry.kv[layer][0][:, :take]
                    values[row, :, pad:] = entry.kv[layer][1][:, :take]
            cache.update(keys, values, layer)

    def _remember(self, rows: list[tuple[list[int], int, int]], cache: Any, end: int) -> None:
        """Offer rows' keys/values to the prefix cache: for each ``(tokens, row, start)``,
        positions ``start:end`` of batch row `row` hold `tokens`.

        The wanted blocks of all rows are gathered by one indexing kernel per layer and
        tensor (not two copies per layer per row: on a GPU, 128 rows finishing together
        cost 6,144 kernel launches that way); each entry keeps a view of its own tokens, and
        the gathered storage counts in full against the prefix cache's budget until its
        last entry is evicted. Rows past that budget are not gathered (the last ones are
        kept, as inserting them one by one would)."""
        if not self._prefix.max_tokens:
            return
        wanted = []
        total = 0
        for tokens, row, start in reversed(rows):
            if len(tokens) == end - start and (n := self._prefix.wanted(tokens)):
                if total + n > self._prefix.max_tokens:
                    break
                wanted.append((tokens, row, start, n))
                total += n
        if not wanted:
            return
        wanted.reverse()
        row_index = torch.tensor(
            [row for _, row, _, n in wanted for _ in range(n)], device=self._device
        )
        col_index = torch.tensor(
            [start + j for _, _, start, n in wanted for j in range(n)], device=self._device
        )
        # [tokens of all entries, kv_heads, head_dim] per layer
        keys = [ly.keys[row_index, :, col_index] for ly in cache.layers]
        values = [ly.values[row_index, :, col_index] for ly in cache.layers]
        shared = Shared(total)
        offset = 0
        for tokens, _, _, n in wanted:
            part = slice(offset, offset + n)
            kv = [
                (k[part].transpose(0, 1), v[part].transpose(0, 1))
                for k, v in zip(keys, values, strict=True)
            ]
            self._prefix.insert(tokens[:n], kv, shared=shared)
            offset += n

    def _merge(
        self, chunk: list[_Request], cache: Any, pads: list[int], length: int, tokens: list[int]
    ) -> None:
        if self._slots is not None:  # copied into the fixed slots
            if self._cache is None:
                self._slots.reset()
                self._cache = self._slots
            grow_old, grow_new = self._slots.merge(cache, length)
            self._pads = [p + grow_old for p in self._pads] + [p + grow_new for p in pads]
            self._cache_len = self._slots.length
        elif self._cache is None:
            self._cache, self._cache_len = cache, length
            self._pads = list(pads)
        else:
            grow_old, grow_new = max(0, length - self._cache_len), max(0, self._cache_len - length)
            for old, new in zip(self._cache.layers, cache.layers, strict=True):
                old.keys = torch.cat(
                    [_left_pad(old.keys, grow_old), _left_pad(new.keys, grow_new)], 0
                )
                old.values = torch.cat(
                    [_left_pad(old.values, grow_old), _left_pad(new.values, grow_new)], 0
                )
            self._pads = [p + grow_old for p in self._pads] + [p + grow_new for p in pads]
            self._cache_len = max(self._cache_len, length)
        with self._cond:
            self._active.extend(chunk)
        self._pending.extend(tokens)
        self._finish_rows()

    def _decode_step(self) -> None:
        if self._slots is not None:
            logits = self._slots.decode(self._model, self._pending, self._pads)
            self._decoded(logits)
            return
        # ids, positions and (when rows are padded) the pads: one host-to-device copy
        rows = [self._pending, [self._cache_len - p for p in self._pads]]
        padded = any(self._pads)
        if padded:
            rows.append(self._pads)
        inputs = torch.tensor(rows).to(self._device)
        mask = None
        if padded:
            columns = torch.arange(self._cache_len + 1, device=self._device)
            mask = (columns >= inputs[2].unsqueeze(-1)).long()
        with torch.inference_mode():
            out = self._model(
                input_ids=inputs[0].unsqueeze(-1),
                attention_mask=mask,
                position_ids=inputs[1].unsqueeze(-1),
                use_cache=True,
                logits_to_keep=1,
                **cache_kwargs(self._model, self._cache),
            )
        self._cache = returned_cache(out)
        self._decoded(out.logits[:, -1, :])

    def _decoded(self, logits: torch.Tensor) -> None:
        """Sample the rows' next tokens from a decode step's `logits`."""
        self._cache_len += 1
        with self._cond:
            self._steps += 1
        self._pending = self._sample(self._active, logits)
        self._finish_rows()

    def _sample(self, rows: list[_Request], logits: torch.Tensor) -> list[int]:
        """Sample one token per row and record it (with logprob, entropy, version)."""
        tokens, logprobs, entropies = sample_next(
            logits,
            [r.params for r in rows],
            [r.generator for r in rows],
            self._rng,
        )
        version = self._version
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
            reason = self._finish_reason(r)
            if reason is None and not r.cancelled:
                keep.append(i)
            else:
                r.finish = reason or "abort"
                done.append(r)
                if reason is not None and r.kv_version == self._version:
                    # its next turn resends this sequence; the last token is not cached yet
                    remember.append((r.prompt + r.tokens[:-1], i, self._pads[i]))
        if remember:
            self._remember(remember, self._cache, self._cache_len)
        if done:
            self._keep_rows(keep)  # free the slots before the callers wake up
        for r in done:
            _resolve(r.future, r.loop, self._result(r))

    def _finish_reason(self, r: _Request) -> FinishReason | None:
        last = r.tokens[-1]
        if last in r.stop_ids:
            return "stop"
        if r.params.stop:
            tail = self._tokenizer.decode(r.tokens[-64:], skip_special_tokens=False)
            if any(s in tail for s in r.params.stop):
                return "stop"
        if len(r.tokens) >= r.params.max_new_tokens:
            return "length"
        if len(r.prompt) + len(r.tokens) >= self.max_context:
            return "length"
        return None

    def _result(self, r: _Request) -> Generation:
        text_ids = r.tokens[:-1] if r.finish == "stop" and r.tokens[-1] in r.stop_ids else r.tokens
        return Generation(
            token_ids=list(r.tokens),
            logprobs=list(r.logprobs),
            versions=list(r.versions),
            finish_reason=r.finish or "abort",
            entropies=list(r.entropies) if r.params.return_entropy else None,
            text=self._tokenizer.decode(text_ids, skip_special_tokens=False),
            metadata={
                "prompt_tokens": len(r.prompt),
                "latency_s": time.perf_counter() - r.started,
                "backend": "hf",
                "on_update": self.on_update,
                "reprefilled_tokens": r.reprefilled,
            },
        )

    def _fail_active(self, error: Exception) -> None:
        for r in self._active:
            _resolve(r.future, r.loop, error)
        with self._cond:
            self._active = []
        self._pads, self._pending, self._cache, self._cache_len = [], [], None, 0


# --- helpers ------------------------------------------------------------------------------


def _fail_chunk(chunk: list[_Plan], what: str, e: Exception) -> None:
    error = SamplerError(f"hf sampler {what} failed: {type(e).__name__}: {e}")
    for r, _, _, _ in chunk:
        _resolve(r.future, r.loop, error)


def _abort(r: _Request) -> Generation:
    return Generation(
        token_ids=list(r.tokens),
        logprobs=list(r.logprobs),
        versions=list(r.versions),
        finish_reason="abort",
    )


def _mask(pads: list[int], length: int, device: torch.device) -> torch.Tensor:
    columns = torch.arange(length, device=device).unsqueeze(0)
    return (columns >= torch.tensor(pads, device=device).unsqueeze(-1)).long()


def _left_pad(t: torch.Tensor, n: int) -> torch.Tensor:
    if n == 0:
        return t
    shape = list(t.shape)
    shape[-2] = n
    return torch.cat([t.new_zeros(shape), t], dim=-2)


def _default_stop_ids(tokenizer: Any, model: Any) -> set[int]:
    ids: set[int] = set()
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None:
        ids.add(int(eos))
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(config_eos, int):
        ids.add(config_eos)
    elif isinstance(config_eos, list | tuple):
        ids.update(int(t) for t in config_eos)
    with contextlib.suppress(Exception):
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(im_end, int) and im_end != getattr(tokenizer, "unk_token_id", None):
            ids.add(im_end)
    return ids
