"""The embedded ``hf`` sampler: one transformers model shared by every concurrent caller.

A worker thread runs a continuous-batching loop. Between two forward passes it applies a
pending weight update, drops cancelled requests, prefills newcomers and merges them into
the running batch; then one decode step advances every active sequence by one token.
The event loop only submits requests and awaits futures, so it never blocks on compute.
The loop is :mod:`agentrl.samplers.hf_scheduler`; this module is the sampler's public
surface (construction, options, generate, weight updates).

KV cache: the active rows, left-padded to a common length, live in one
:class:`~agentrl.samplers.batch_kv.BatchKV` whatever the ``kv_cache`` mode (``growing``
appends in place, ``dynamic`` is transformers' cache, ``static`` keeps fixed slots whose
decode steps replay as CUDA graphs on a GPU). Each row keeps its own pad count; positions
and the attention mask are per row, so rows of different lengths decode together exactly
(RoPE is applied with the row's own positions before keys are cached, so padding columns
never shift anything). Finished rows are removed between steps and columns that are
padding in every row are trimmed away. Prefills (:mod:`agentrl.samplers.hf_prefill`) reuse
the prefix cache; requests and their answers are :mod:`agentrl.samplers.hf_requests`.

Behaviour log-probs follow :mod:`agentrl.samplers.base`: ``log_softmax(logits / T)`` at the
sampled token, before top-p / top-k truncation (greedy: unscaled logits).

New weights arrive between two forward passes; what the rows in flight do is the
``on_update`` option (:mod:`agentrl.samplers.hf_swap`). Each :class:`Generation` says which
was used (``metadata["on_update"]``) and how many context
tokens were re-prefilled for it (``metadata["reprefilled_tokens"]``); the episode runner
copies both onto the trajectory's :class:`~agentrl.types.Turn`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import anyio
import torch

from agentrl.cpu import release_freed_memory
from agentrl.cpu_linear import DECODE_ROWS, route_linears
from agentrl.devices import check_memory, resolve_device, sampler_bytes
from agentrl.errors import SamplerError, WeightUpdateError
from agentrl.models import load_model
from agentrl.samplers.base import Generation, Sampler, SamplingParams, WeightsLike
from agentrl.samplers.batch_kv import KV_CACHE_MODES, batch_kv
from agentrl.samplers.hf_requests import (
    Request,
    Update,
    check_prompt,
    copy_in_place,
    default_stop_ids,
)
from agentrl.samplers.hf_scheduler import BatchScheduler
from agentrl.samplers.hf_swap import ON_UPDATE, WeightSwaps
from agentrl.samplers.options import check_options, resolve_on_update, shared_options
from agentrl.samplers.precision import QUANTIZED, check_precision, load_dtype_for, quantize
from agentrl.samplers.prefix_cache import PrefixCache
from agentrl.samplers.settings import SamplerSettings
from agentrl.weights.gate import WeightGate
from agentrl.weights.spec import WeightSpec

log = logging.getLogger(__name__)


CUDA_GRAPHS = ("auto", "on", "off")  # decode steps replayed as CUDA graphs (kv_cache=static)


class HFSampler(WeightSwaps, BatchScheduler, Sampler):
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
    graphs and replayed; ``on``: the same, refused elsewhere; ``off``: eager),
    ``weight_precision`` (``int8`` / ``fp8``: the linear layers quantized by torchao, and
    requantized on each weight update; :mod:`agentrl.samplers.precision`).
    """

    backend = "hf"
    weight_payload = "state_dict"  # what the WeightBus hands to update_weights

    @classmethod
    def options_from_settings(cls, settings: SamplerSettings) -> dict[str, Any]:
        options = shared_options(settings)
        policy = resolve_on_update(settings, cls)
        options.update(
            max_batch_size=settings.max_batch_size,
            on_update=policy,
            weight_precision=settings.weight_precision,
        )
        return options

    @classmethod
    def from_settings(cls, settings: SamplerSettings) -> HFSampler:
        """Its own model copy on ``sampler.device`` in ``model.dtype`` or
        ``sampler.weight_precision`` (the learner keeps float32 masters of its own); the
        memory it needs is checked before it decodes."""
        options = cls.options_from_settings(settings)
        # resolved by the run layer (this parses it; auto stays usable in scripts)
        device = resolve_device(settings.device, "sampler.device")
        model_dtype = None if settings.model_dtype == "auto" else settings.model_dtype
        model, tokenizer = load_model(
            settings.model_name,
            dtype=load_dtype_for(settings.weight_precision, model_dtype),
            device=device,
            seed=settings.model_seed,
        )
        # float32 on a CPU: oneDNN or torch, timed (auto) at a decode step's rows
        route_linears(model, settings.model_cpu_linear, DECODE_ROWS)
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
        weight_precision: str = "auto",
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1 (got {max_batch_size})")
        if kv_cache not in KV_CACHE_MODES:
            raise ValueError(
                f"kv_cache must be one of {', '.join(KV_CACHE_MODES)} (got {kv_cache!r})"
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
        # requantizing on an update makes new weight tensors, which captured graphs would miss
        quantized = check_precision(weight_precision) in QUANTIZED
        if cuda_graphs == "on" and quantized:
            raise ValueError(
                f"cuda_graphs=on cannot be used with sampler.weight_precision={weight_precision} "
                "(each update requantizes into new tensors); set cuda_graphs=auto/off"
            )
        self.kv_cache = kv_cache
        self.cuda_graphs = kv_cache == "static" and on_cuda and cuda_graphs != "off"
        self.cuda_graphs = self.cuda_graphs and not quantized
        self._vocab = int(model.get_output_embeddings().weight.shape[0])
        self.max_batch_size = max_batch_size
        self.max_context = int(
            max_context or getattr(model.config, "max_position_embeddings", 2048)
        )
        self.prefill_tokens = max(1, prefill_tokens)
        # the active rows' keys/values, and the kind of cache a prefill fills
        self._kv, self._new_cache = batch_kv(
            kv_cache,
            self._device,
            slots=max_batch_size,
            capacity=self.max_context,
            graphs=self.cuda_graphs,
        )
        if default_stop_token_ids is None:
            default_stop_token_ids = default_stop_ids(tokenizer, model)
        self.default_stop_token_ids = frozenset(int(t) for t in default_stop_token_ids)
        self._version = version
        self._requested_version = version
        self._rng = torch.Generator(device="cpu")
        self._rng.manual_seed(seed if seed is not None else int(torch.seed() % 2**63))
        # names and shapes new weights must have (checked before anything is copied); taken
        # before quantizing, which unties a tied LM head from the embeddings
        self._spec = WeightSpec.from_model(model)
        self.weight_precision = weight_precision
        self._quantized = quantize(model, weight_precision)
        self._share = False  # computes on the publisher's tensors (share_weights_from)
        # taken around each forward pass when those tensors change as it generates
        self._gate: WeightGate | None = None
        self._pass_version = version

        self._cond = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._updates: deque[Update] = deque()
        self._closed = False
        self._thread: threading.Thread | None = None
        # batch state, touched only by the worker thread
        self._active: list[Request] = []
        self._pads: list[int] = []
        self._pending: list[int] = []  # sampled token of each row not yet fed to the model
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
        """Active rows, waiting requests, decode steps and tokens produced so far, and the
        prefix cache's use."""
        with self._cond:
            return {
                "active": len(self._active),
                "waiting": len(self._waiting),
                "steps": self._steps,
                "tokens": self._tokens_out,
                "version": self._version,
                "prefill_tokens": self._prefilled,
                "prefix_reused_tokens": self._prefix.reused_tokens,
                "prefix_cached_tokens": self._prefix.tokens,  # held now (KV kept for reuse)
                # forward passes' wait for the learner's writes (share_weights_from, a gate)
                "weight_gate_wait_s": self._gate.read_wait_s if self._gate is not None else 0.0,
                "reprefill_tokens": self._reprefilled,
                "reprefills": self._reprefills,
                "reprefill_s": self._reprefill_s,
                "cuda_graphs": self._kv.captured,
                "graph_replays": self._kv.replays,
                "graph_fallbacks": self._kv.capture_failures,
            }

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        if params.n != 1:
            raise ValueError(
                f"generate samples one continuation; use generate_many for n={params.n}"
            )
        prompt = check_prompt(prompt_ids, self.max_context, self._vocab)
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device="cpu")
            generator.manual_seed(params.seed)
        loop = asyncio.get_running_loop()
        request = Request(
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

    def share_weights_from(
        self, weights: Mapping[str, torch.Tensor], gate: WeightGate | None = None
    ) -> int:
        """Compute on `weights` (a publish's tensors: the learner's live weights) instead of
        a copy of them, from now on: every later update re-points the parameters at the
        published tensors rather than copying. Call it before the first request.

        Without `gate`, only for a publisher that never changes its tensors while this
        sampler generates (a synchronous run: sampling and training take turns). With it
        (an asynchronous run), the publisher changes them only inside ``gate.writing()``
        and every forward pass here runs inside ``gate.reading()``: a pass sees one
        optimizer step's weights, and rows in flight go on with the newer ones at the next
        pass (``on_update: keep``), each token tagged with the version the gate gives
        the pass that produced it (:mod:`agentrl.weights.gate`).

        Tensors in another dtype or on another device are still copied; quantized weights
        and CUDA-graph replays keep their own copy. Returns the bytes of the sampler's own
        weights it let go (0: nothing shared, and `gate` is not kept)."""
        with self._cond:
            if self._thread is not None:
                raise SamplerError("share_weights_from must come before the first request")
        if gate is not None and self.on_update != "keep":
            raise SamplerError(
                f"on_update={self.on_update} needs the weights to stay put while rows are in "
                "flight, so this sampler cannot compute on weights that train under it; "
                "use on_update=keep, or keep a copy (do not call share_weights_from)"
            )
        if self._quantized or self.cuda_graphs:
            return 0
        state = self._spec.validate(weights, self._version)
        before = _own_bytes(self._model)
        copy_in_place(self._model, state, share=True)
        self._share = True
        release_freed_memory()  # the dropped copy's pages leave the process
        saved = before - _own_bytes(self._model, exclude=state.values())
        self._gate = gate if saved > 0 else None
        return saved

    async def update_weights(self, weights: WeightsLike, version: int) -> None:
        with self._cond:
            if version <= self._requested_version:
                raise WeightUpdateError(
                    f"weight versions only go up: got {version}, sampler is at "
                    f"{self._requested_version}; publish version {self._requested_version + 1} or later"
                )
        state = await anyio.to_thread.run_sync(self._spec.validate, weights, self._version)
        loop = asyncio.get_running_loop()
        update = Update(state=state, version=version, loop=loop, future=loop.create_future())
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


def _own_bytes(model: Any, exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of `model`'s parameter storages, each once, less those `exclude` also uses."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}
    for p in model.parameters():
        ptr = p.untyped_storage().data_ptr()
        if ptr not in skip:
            seen[ptr] = p.untyped_storage().nbytes()
    return sum(seen.values())
