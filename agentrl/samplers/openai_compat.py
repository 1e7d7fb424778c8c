"""The `openai` sampler: an httpx client for any OpenAI-compatible ``/v1/completions`` server.

Token ids go in as the prompt (a list of ints) and come back exactly: the request asks for
``return_token_ids`` and ``return_tokens_as_token_ids`` (vLLM extensions; tokens are then
``"token_id:123"`` strings) and ``logprobs`` (the sampled token's log-prob, plus the top-k
when entropy is wanted). Generated text is never re-tokenised; a server that returns
neither token ids nor ``token_id:`` tokens is reported as an error.

Log-prob definition: whatever the server computes. vLLM must be started with
``--logprobs-mode processed_logprobs`` to match ours (see ``agentrl.samplers.vllm``); its
default ``raw_logprobs`` is before temperature.

Weights: the plain OpenAI API cannot change weights. ``update_weights`` works only with
``reload_endpoint=True`` against a vLLM server started with ``VLLM_SERVER_DEV_MODE=1`` and
``--worker-extension-cls agentrl.samplers.vllm_worker.AgentRLWorkerExtension`` on the same
host (it reads the safetensors folder we write to ``/dev/shm``): the client drains its own
in-flight requests, then ``/pause?mode=keep``, ``/collective_rpc`` agentrl_reload_weights,
``/update_weight_version``, ``/reset_prefix_cache``, ``/resume``. Tokens are tagged with
the version at request start, which is exact for this client's requests because updates
drain them first.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import anyio
import httpx

from agentrl.errors import ConfigError, PromptError, SamplerError, WeightUpdateError
from agentrl.models import DEFAULT_MODEL, load_tokenizer, resolve_model_dir
from agentrl.samplers.base import FinishReason, Generation, Sampler, SamplingParams, WeightsLike
from agentrl.samplers.options import check_options, resolve_on_update, shared_options
from agentrl.samplers.settings import SamplerSettings
from agentrl.samplers.vllm_worker import RELOAD_METHOD, WORKER_EXTENSION
from agentrl.weights.files import shm_root
from agentrl.weights.spec import WeightSpec

_TOKEN_PREFIX = "token_id:"
_RETRY_STATUS = {408, 429, 500, 502, 503, 504}


_FINISHES_IN_FLIGHT = (
    "the openai backend finishes in-flight requests before a weight reload, so use drain"
)


class OpenAISampler(Sampler):
    """Samples from an OpenAI-compatible completions server over HTTP.

    Options: ``base_url`` (e.g. ``http://127.0.0.1:8000``; ``/v1`` is added when missing),
    ``model`` (served model name; default: the first one ``/v1/models`` lists),
    ``api_key``, ``timeout`` (seconds per request), ``max_retries`` (on connection errors,
    timeouts, 408/429/5xx; exponential backoff with jitter from ``backoff`` seconds),
    ``max_concurrency`` (requests in flight), ``entropy_top_k``, ``reload_endpoint`` and
    ``model_dir`` (for ``update_weights``, see the module doc), ``context_length`` (the
    server's context, which bounds each turn's ``max_tokens``; None = unknown).
    """

    backend = "openai"
    on_update_default = "drain"
    on_update_cannot: ClassVar[dict[str, str]] = {
        "keep": _FINISHES_IN_FLIGHT,
        "reprefill": _FINISHES_IN_FLIGHT,
    }

    @classmethod
    def options_from_settings(cls, settings: SamplerSettings) -> dict[str, Any]:
        """A server elsewhere decides its own placement, precision and batching."""
        s = settings
        options = shared_options(s, remote=True)
        resolve_on_update(s, cls)  # only drain is possible here
        rejected = {
            "model.dtype": s.user_set("model.dtype") and s.model_dtype != "auto",
            "sampler.device": s.user_set("sampler.device") and s.device != "auto",
        }
        bad = [k for k, v in rejected.items() if v]
        if bad:
            why = {
                "model.dtype": "the server's precision is set where it starts (vllm serve --dtype)",
                "sampler.device": "the server places itself",
            }[bad[0]]
            raise ConfigError(
                f"{bad[0]} cannot be honoured by sampler.backend=openai: {why}; remove it or "
                "use sampler.backend=hf or vllm"
            )
        if s.user_set("sampler.max_batch_size"):
            options["max_concurrency"] = s.max_batch_size  # requests in flight to the server
        if s.base_url:
            options["base_url"] = s.base_url
        if s.api_key:
            options["api_key"] = s.api_key
        return options

    @classmethod
    def from_settings(cls, settings: SamplerSettings) -> OpenAISampler:
        options = cls.options_from_settings(settings)
        options.setdefault("tokenizer", load_tokenizer(settings.model_name))
        check_options(cls, options)
        return cls(model=settings.model_name, **options)

    def __init__(
        self,
        model: str | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 120.0,
        connect_timeout: float = 5.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        max_concurrency: int = 64,
        entropy_top_k: int = 5,
        reload_endpoint: bool = False,
        model_dir: str | os.PathLike[str] | None = None,
        initial_version: int = 0,
        tokenizer: Any = None,
        context_length: int | None = None,
    ) -> None:
        if not base_url:
            raise ValueError(
                "the openai sampler needs base_url (sampler.base_url in the config), "
                "e.g. http://127.0.0.1:8000"
            )
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0 (got {max_retries})")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds (got {timeout})")
        root = base_url.rstrip("/")
        self.server_url = root[: -len("/v1")] if root.endswith("/v1") else root
        self.api_url = self.server_url + "/v1"
        self.model = model
        self._model_checked = False
        self.max_retries = max_retries
        self.backoff = backoff
        self.entropy_top_k = entropy_top_k
        self.reload_endpoint = reload_endpoint
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self._tokenizer = tokenizer
        self._context_length = context_length
        self._version = initial_version
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=max_concurrency),
        )
        self._limiter = anyio.CapacityLimiter(max_concurrency)
        self._in_flight = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._gate: anyio.Event | None = None
        self._update_lock = anyio.Lock()
        self._shm_dir: Path | None = None

    @property
    def version(self) -> int:
        return self._version

    @property
    def context_length(self) -> int | None:
        return self._context_length

    @property
    def vocab_size(self) -> int:
        """``model_dir``'s config.json ``vocab_size``, else the tokenizer's size."""
        if self.model_dir is not None and (self.model_dir / "config.json").is_file():
            import json

            return int(json.loads((self.model_dir / "config.json").read_text())["vocab_size"])
        return len(self.tokenizer)

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            if self.model_dir is None:
                raise SamplerError("the openai sampler has no tokenizer: pass model_dir=")
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        return self._tokenizer

    async def close(self) -> None:
        await self._client.aclose()
        if self._shm_dir is not None:
            shutil.rmtree(self._shm_dir, ignore_errors=True)

    # -- HTTP -----------------------------------------------------------------------------

    async def _request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """One call with retries on transient failures; raises SamplerError when spent."""
        last: str = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = self.backoff * 2 ** (attempt - 1)
                await anyio.sleep(delay * (0.5 + random.random()))
            try:
                response = await self._client.request(method, url, **kwargs)
            except httpx.TimeoutException as e:
                last = f"timed out ({type(e).__name__})"
                continue
            except httpx.TransportError as e:
                last = f"connection failed ({type(e).__name__}: {e})"
                continue
            if response.status_code in _RETRY_STATUS:
                last = f"HTTP {response.status_code}: {_detail(response)}"
                continue
            if response.status_code >= 400:
                detail = _detail(response)
                if response.status_code == 400 and _is_context_error(detail):
                    raise PromptError(f"server rejected the prompt: {detail}")
                raise SamplerError(
                    f"{method} {url} failed with HTTP {response.status_code}: {detail}"
                )
            return response
        raise SamplerError(
            f"{method} {url} failed after {self.max_retries + 1} attempts: {last}. "
            "Is the server running and is sampler.base_url right?"
        )

    async def served_model(self) -> str:
        """The served model name: `model` if the server lists it, else its only model.

        `model` may also be our alias or a local folder (what ``create_sampler`` passes by
        default): the server's model is used and the folder gives the tokenizer.
        """
        if self._model_checked:
            return str(self.model)
        data = (await self._request("GET", f"{self.api_url}/models")).json()
        served = [m["id"] for m in data.get("data", [])]
        if not served:
            raise SamplerError(f"{self.api_url}/models lists no model")
        local = self.model is not None and (
            self.model == DEFAULT_MODEL or Path(self.model).expanduser().exists()
        )
        if local and self.model_dir is None:  # also when the server names it by its path
            self.model_dir = resolve_model_dir(self.model)
        if self.model not in served:
            if self.model is not None and not (local and len(served) == 1):
                raise SamplerError(
                    f"the server at {self.api_url} does not serve model {self.model!r}; "
                    f"it serves {', '.join(served)} (set the sampler's model to one of them)"
                )
            self.model = served[0]
        self._model_checked = True
        return str(self.model)

    # -- generation -----------------------------------------------------------------------

    def _body(self, ids: list[int], params: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": ids,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "n": 1,
            "logprobs": self.entropy_top_k if params.return_entropy else 0,
            "stop": list(params.stop),
            "stream": False,
            # vLLM extensions: exact token ids, keep stop strings, no detokeniser cleanup
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
        }
        if params.top_k:
            body["top_k"] = params.top_k
        if params.stop_token_ids:
            body["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            body["seed"] = params.seed
        return body

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise PromptError("prompt_ids is empty: pass at least one token id")
        if params.n != 1:
            raise ValueError(
                f"generate() samples one continuation (got n={params.n}); use generate_many()"
            )
        await self.served_model()
        while self._gate is not None:  # an update is draining this client's requests
            await self._gate.wait()
        version = self._version
        self._in_flight += 1
        if self._in_flight == 1:
            self._idle = anyio.Event()
        try:
            async with self._limiter:
                response = await self._request(
                    "POST", f"{self.api_url}/completions", json=self._body(ids, params)
                )
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()
        return _parse_choice(response.json(), params, version)

    # -- weights --------------------------------------------------------------------------

    async def update_weights(self, weights: WeightsLike, version: int) -> None:
        if not self.reload_endpoint:
            raise WeightUpdateError(
                "the OpenAI completions API cannot update weights. Use the vllm backend, "
                "or start `vllm serve` with VLLM_SERVER_DEV_MODE=1 on this host and pass "
                "reload_endpoint=True and model_dir= to the openai sampler"
            )
        if self.model_dir is None:
            raise WeightUpdateError("reload_endpoint=True needs model_dir= (the served folder)")
        async with self._update_lock:
            if version <= self._version:
                raise WeightUpdateError(
                    f"weight versions only go up: got {version}, sampler is at {self._version}"
                )
            if self._shm_dir is None:
                self._shm_dir = shm_root() / f"agentrl-openai-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            # a state dict is checked and written to /dev/shm; a folder is checked
            spec = WeightSpec.from_folder(self.model_dir)
            path = await anyio.to_thread.run_sync(
                spec.stage, weights, self._shm_dir / f"v{version}", self._version, self.model_dir
            )
            self._gate = anyio.Event()
            try:
                await self._idle.wait()
                await self._swap(path, version)
            finally:
                gate, self._gate = self._gate, None
                gate.set()
                if self._shm_dir is not None and path.parent == self._shm_dir:
                    shutil.rmtree(path, ignore_errors=True)

    async def _swap(self, path: Path, version: int) -> None:
        url = self.server_url
        await self._request("POST", f"{url}/pause", params={"mode": "keep"})
        try:
            try:
                await self._request(
                    "POST",
                    f"{url}/collective_rpc",
                    json={"method": RELOAD_METHOD, "kwargs": {"weights_path": str(path)}},
                )
            except SamplerError as e:
                raise WeightUpdateError(
                    f"the server did not reload the weights ({e}); it stays on version "
                    f"{self._version}. Is it started with VLLM_SERVER_DEV_MODE=1 and "
                    f"--worker-extension-cls {WORKER_EXTENSION}?"
                ) from e
            await self._request(
                "POST", f"{url}/update_weight_version", json={"new_version": str(version)}
            )
            self._version = version
            await self._request(
                "POST", f"{url}/reset_prefix_cache", params={"reset_running_requests": "true"}
            )
        finally:
            await self._request("POST", f"{url}/resume")


def _detail(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(data, dict):
        err = data.get("error", data.get("detail", data))
        if isinstance(err, dict):
            return str(err.get("message", err))[:300]
        return str(err)[:300]
    return str(data)[:300]


def _is_context_error(detail: str) -> bool:
    text = detail.lower()
    return "context" in text or ("maximum" in text and "length" in text)


def _token_id(token: str) -> int:
    if not token.startswith(_TOKEN_PREFIX):
        raise SamplerError(
            f"server returned token {token!r} without an id; it must support "
            "return_tokens_as_token_ids (vLLM does)"
        )
    return int(token[len(_TOKEN_PREFIX) :])


def _parse_choice(data: Mapping[str, Any], params: SamplingParams, version: int) -> Generation:
    try:
        choice = data["choices"][0]
    except (KeyError, IndexError, TypeError) as e:
        raise SamplerError(f"malformed completions response (no choices): {data!r:.300}") from e
    logprobs = choice.get("logprobs") or {}
    tokens = logprobs.get("tokens") or []
    token_ids = choice.get("token_ids")
    if token_ids is None:
        token_ids = [_token_id(t) for t in tokens]
    token_ids = [int(t) for t in token_ids]
    token_logprobs = logprobs.get("token_logprobs") or []
    if len(token_logprobs) != len(token_ids) or any(lp is None for lp in token_logprobs):
        raise SamplerError(
            f"server returned {len(token_logprobs)} logprobs for {len(token_ids)} tokens; "
            "it must support `logprobs` on /v1/completions"
        )
    entropies = None
    if params.return_entropy:
        entropies = [_entropy((top or {}).values()) for top in logprobs.get("top_logprobs") or []]
        if len(entropies) != len(token_ids):
            raise SamplerError("server returned no top_logprobs for some tokens")
    reason = choice.get("finish_reason")
    finish: FinishReason = reason if reason in ("stop", "length", "abort") else "abort"
    return Generation(
        token_ids=token_ids,
        logprobs=[float(lp) for lp in token_logprobs],
        versions=[version] * len(token_ids),
        finish_reason=finish,
        entropies=entropies,
        text=choice.get("text") or "",
        metadata={
            "stop_reason": choice.get("stop_reason"),
            "id": data.get("id"),
            "on_update": "drain",  # update_weights drains this client's requests first
        },
    )


def _entropy(top_logprobs: Any) -> float:
    """Entropy lower bound from top-k log-probs (tail lumped into one outcome)."""
    probs = [math.exp(lp) for lp in top_logprobs if lp is not None and lp > -math.inf]
    entropy = -sum(p * math.log(p) for p in probs if p > 0)
    rest = 1.0 - sum(probs)
    if rest > 1e-12:
        entropy -= rest * math.log(rest)
    return entropy
