"""The Tinker REST API over HTTP: the routes the official ``tinker`` SDK calls.

    GET  /api/v1/healthz, /api/v1/get_server_capabilities, /api/v1/samplers/{id}
    POST /api/v1/client/config, /client/dynamic_config, /create_session, /session_heartbeat,
         /telemetry (accepted, dropped), /create_model, /get_info, /forward_backward
         (protobuf), /optim_step, /save_weights, /save_weights_for_sampler, /load_weights,
         /unload_model, /create_sampling_session, /join_sampling_session, /asample,
         /retrieve_future, /cancel_future, /sessions/{id}/finish (frees its adapters)

JSON bodies are validated with the SDK's own request models (a bad field is a 400 naming
it); work goes through :class:`~agentrl.run.tinker.futures.Futures`. Errors are
``{"detail": message}`` with 400 (bad request) or 404 (unknown model, path or future).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import threading
import uuid
from typing import Any

from pydantic import ValidationError

from agentrl.extras import require

try:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
except ModuleNotFoundError:
    require("fastapi", "tinker", "the Tinker server")  # MissingExtra naming the extra
    raise
from agentrl.run.tinker import losses
from agentrl.run.tinker.adapters import LoraSpec, RequestError
from agentrl.run.tinker.decode import DecodeParams
from agentrl.run.tinker.decode import Request as SampleJob
from agentrl.run.tinker.engine import Engine
from agentrl.run.tinker.futures import Futures
from agentrl.run.tinker.wire import (
    WireError,
    forward_backward_output,
    parse_forward_backward,
    sample_response,
)

MAX_SAMPLES = 256  # num_samples per request
DEFAULT_MAX_TOKENS = 256  # when sampling_params.max_tokens is unset
UNSUPPORTED_SAMPLE = {
    "topk_prompt_logprobs": 0,
    "topk_sample_logprobs": 0,
    "target_prompt_logprobs": None,
    "prompt_alt_tokens_k": 0,
    "prompt_logprobs_last_n": None,
}


class TinkerService:
    """The server's state: sessions, sampling sessions and the engine behind the futures."""

    def __init__(self, engine: Engine, tokenizer_id: str) -> None:
        self.engine = engine
        self.tokenizer_id = tokenizer_id
        self.futures = Futures(
            (RequestError, losses.LossError, WireError, ValueError), self._sample_batch
        )
        self.sessions: dict[str, itertools.count[int]] = {}
        self.samplers: dict[str, dict[str, Any]] = {}  # sampling session -> base/model_path
        self.requests = 0

    def close(self) -> None:
        self.futures.close()
        self.engine.close()

    def _sample_batch(self, jobs: list[tuple[str | None, SampleJob]]) -> list[Any]:
        out = self.engine.sample_batch(jobs)
        return [r if isinstance(r, BaseException) else sample_response(*r) for r in out]


def _types() -> Any:
    return require("tinker.types", "tinker", "the Tinker server")


def create_app(service: TinkerService) -> Any:
    types = _types()
    app = FastAPI(title="agentrl tinker", docs_url=None, redoc_url=None, openapi_url=None)
    engine = service.engine

    @app.middleware("http")
    async def _count(request: Request, call_next: Any) -> Any:
        service.requests += 1
        return await call_next(request)

    @app.exception_handler(RequestError)
    async def _request_error(request: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    @app.exception_handler(ValidationError)
    async def _invalid(request: Request, exc: ValidationError) -> JSONResponse:
        where = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        return JSONResponse({"detail": f"{request.url.path}: {where}"}, status_code=400)

    @app.exception_handler(losses.LossError)
    @app.exception_handler(WireError)
    async def _bad(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": f"{request.url.path}: {exc}"}, status_code=400)

    async def body(request: Request, model: Any) -> Any:
        try:
            payload = json.loads(await request.body() or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(f"{request.url.path}: the body is not JSON ({e})") from None
        return model.model_validate(payload)

    def future(fn: Any, model_id: str | None = None, **extra: Any) -> dict[str, Any]:
        return {"request_id": service.futures.submit(fn), "model_id": model_id, **extra}

    def training(model_id: str) -> None:
        engine.model(model_id)  # 404 now, before the request is queued

    # --- service -------------------------------------------------------------------------

    @app.get("/api/v1/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities() -> dict[str, Any]:
        model = {
            "model_name": engine.base_model,
            "max_context_length": engine.context_length,
            "trainable": True,
            "sampleable": True,
        }
        return {"supported_models": [model]}

    @app.post("/api/v1/client/config")
    async def client_config() -> dict[str, Any]:
        # serial fwd/bwd chunks: the worker runs requests in arrival order
        return {"parallel_fwdbwd_chunks": False, "use_pyqwest_transport": False}

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config() -> dict[str, Any]:
        return {}

    @app.post("/api/v1/create_session")
    async def create_session(request: Request) -> dict[str, Any]:
        await body(request, types.CreateSessionRequest)
        session_id = f"session-{uuid.uuid4().hex[:12]}"
        service.sessions[session_id] = itertools.count(1)
        return {"type": "create_session", "session_id": session_id}

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat() -> dict[str, Any]:
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish_session(session_id: str) -> Response:
        # the session's adapters and optimizers go; its saved checkpoints stay on disk
        service.sessions.pop(session_id, None)
        prefix = f"{session_id}:train:"
        for model_id in [m for m in engine.models if m.startswith(prefix)]:
            service.futures.submit(lambda m=model_id: engine.unload(m))
        return Response(status_code=204)

    @app.post("/api/v1/telemetry")
    async def telemetry() -> dict[str, Any]:
        return {"status": "accepted"}

    # --- training ------------------------------------------------------------------------

    @app.post("/api/v1/create_model")
    async def create_model(request: Request) -> dict[str, Any]:
        req = await body(request, types.CreateModelRequest)
        if req.base_model != engine.base_model:
            raise RequestError(
                f"base_model {req.base_model!r} is not served here; this server holds "
                f"{engine.base_model!r} (get_server_capabilities lists it)"
            )
        if req.lora_config is None:
            raise RequestError("create_model: full fine-tuning is not supported; pass lora_config")
        if getattr(req.optimizer_config, "type", "adamw") != "adamw":
            raise RequestError(
                f"optimizer_config.type {req.optimizer_config.type!r} is not supported (adamw)"
            )
        lc = req.lora_config
        spec = LoraSpec(lc.rank, lc.train_attn, lc.train_mlp, lc.train_unembed, lc.seed)
        model_id = f"{req.session_id}:train:{req.model_seq_id}"
        return future(lambda: engine.create_model(model_id, spec), model_id)

    @app.post("/api/v1/get_info")
    async def get_info(request: Request) -> dict[str, Any]:
        req = await body(request, types.GetInfoRequest)
        tm = engine.model(req.model_id)
        return {
            "type": "get_info",
            "model_id": req.model_id,
            "model_name": engine.base_model,
            "is_lora": True,
            "lora_rank": tm.spec.rank,
            "model_data": {
                "arch": engine.arch,
                "model_name": engine.base_model,
                "tokenizer_id": service.tokenizer_id,
            },
        }

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request) -> dict[str, Any]:
        raw = await request.body()
        call = parse_forward_backward(raw, request.headers.get("content-encoding"))
        training(call.model_id)
        losses.check(call.loss_fn, call.data, call.config)

        def run() -> bytes:
            outputs, metrics = engine.forward_backward(call)
            return forward_backward_output(outputs, metrics)

        return future(run, call.model_id)

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request) -> dict[str, Any]:
        req = await body(request, types.OptimStepRequest)
        if not isinstance(req.optim_params, types.AdamParams):
            raise RequestError(
                f"optim_step: optimizer {getattr(req.optim_params, 'type', '?')!r} is not "
                "supported; send types.AdamParams"
            )
        adam = req.optim_params.model_dump()
        training(req.model_id)
        return future(lambda: engine.optim_step(req.model_id, adam), req.model_id)

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request) -> dict[str, Any]:
        req = await body(request, types.SaveWeightsRequest)
        training(req.model_id)
        name = req.path or f"step{engine.model(req.model_id).steps}"
        return future(lambda: engine.save_state(req.model_id, name), req.model_id)

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request: Request) -> dict[str, Any]:
        req = await body(request, types.SaveWeightsForSamplerRequest)
        training(req.model_id)

        def run() -> dict[str, Any]:
            path = engine.save_for_sampler(req.model_id, req.path)
            if req.path is not None:
                return {"path": path, "type": "save_weights_for_sampler"}
            sid = f"sampler-{uuid.uuid4().hex[:12]}"
            service.samplers[sid] = {"model_path": path, "clients": itertools.count(1)}
            return {"path": path, "sampling_session_id": sid, "type": "save_weights_for_sampler"}

        return future(run, req.model_id)

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request) -> dict[str, Any]:
        req = await body(request, types.LoadWeightsRequest)
        if req.model_id is None:  # create_training_client_from_state: a new model
            if req.session_id is None or req.model_seq_id is None:
                raise RequestError("load_weights: give model_id, or session_id and model_seq_id")
            model_id = f"{req.session_id}:train:{req.model_seq_id}"
            create = True
        else:
            model_id, create = req.model_id, False
            training(model_id)
        return future(
            lambda: engine.load_state(req.path, req.optimizer, model_id, create), model_id
        )

    @app.post("/api/v1/unload_model")
    async def unload_model(request: Request) -> dict[str, Any]:
        req = await body(request, types.UnloadModelRequest)
        training(req.model_id)
        return future(lambda: engine.unload(req.model_id), req.model_id)

    # --- sampling ------------------------------------------------------------------------

    def sampler_target(base_model: str | None, model_path: str | None) -> dict[str, Any]:
        if model_path is None and base_model != engine.base_model:
            raise RequestError(
                f"base_model {base_model!r} is not served here; this server holds "
                f"{engine.base_model!r}"
            )
        if model_path is not None:
            engine._folder(model_path)  # a malformed path is a 400 now
        return {"model_path": model_path, "clients": itertools.count(1)}

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request) -> dict[str, Any]:
        req = await body(request, types.CreateSamplingSessionRequest)
        sid = f"sampler-{uuid.uuid4().hex[:12]}"
        service.samplers[sid] = sampler_target(req.base_model, req.model_path)
        return {"type": "create_sampling_session", "sampling_session_id": sid}

    def sampler(sid: str) -> dict[str, Any]:
        if sid not in service.samplers:
            raise RequestError(f"unknown sampling session {sid!r}", 404)
        return service.samplers[sid]

    @app.post("/api/v1/join_sampling_session")
    async def join(request: Request) -> dict[str, Any]:
        req = await body(request, types.JoinSamplingSessionRequest)
        return {
            "type": "join_sampling_session",
            "client_counter": next(sampler(req.sampling_session_id)["clients"]),
        }

    @app.get("/api/v1/samplers/{sid}")
    async def get_sampler(sid: str) -> dict[str, Any]:
        return {
            "sampler_id": sid,
            "base_model": engine.base_model,
            "model_path": sampler(sid)["model_path"],
        }

    @app.post("/api/v1/asample")
    async def asample(request: Request) -> dict[str, Any]:
        req = await body(request, types.SampleRequest)
        if req.sampling_session_id is not None:
            model_path = sampler(req.sampling_session_id)["model_path"]
        else:
            model_path = sampler_target(req.base_model, req.model_path)["model_path"]
        for name, default in UNSUPPORTED_SAMPLE.items():
            if getattr(req, name) != default:
                raise RequestError(
                    f"asample: {name} is not supported by this server (plain sampling with "
                    "log-probs and prompt_logprobs are)"
                )
        if not 1 <= req.num_samples <= MAX_SAMPLES:
            raise RequestError(
                f"asample: num_samples must be 1..{MAX_SAMPLES} (got {req.num_samples})"
            )
        try:
            prompt = req.prompt.to_ints()
        except ValueError as e:
            raise RequestError(f"asample: prompt: {e} (text tokens only)") from None
        params = decode_params(req.sampling_params, engine.tokenizer)
        job = SampleJob(prompt, req.num_samples, params, prompt_logprobs=bool(req.prompt_logprobs))
        engine.check_sample(job)  # a 400 now for what is wrong with the request itself
        rid = service.futures.submit_batched((model_path, job))
        ids = [f"{rid}:{i}" for i in range(req.num_samples)]
        return {"request_id": rid, "sample_sequence_ids": ids}

    # --- futures -------------------------------------------------------------------------

    @app.post("/api/v1/retrieve_future")
    async def retrieve(request: Request) -> Any:
        req = await body(request, types.FutureRetrieveRequest)
        if not service.futures.known(req.request_id):
            raise RequestError(f"unknown request_id {req.request_id!r}", 404)
        result = await service.futures.wait(req.request_id)
        if result is None:
            return {"type": "try_again", "request_id": req.request_id, "queue_state": "active"}
        if not result.ok:
            category = "user" if result.user_error else "server"
            return {"error": result.value, "category": category}
        if isinstance(result.value, bytes):
            return Response(result.value, media_type="application/x-protobuf")
        return result.value

    @app.post("/api/v1/cancel_future")
    async def cancel() -> Response:
        return Response(status_code=204)  # the work is short; it finishes and is dropped

    return app


def decode_params(sp: Any, tokenizer: Any) -> DecodeParams:
    """The SDK's SamplingParams as the decoder's, with Tinker's stop rules: None stops at
    EOS, a list of ids or strings stops there, [] never stops before max_tokens."""
    stop = sp.stop
    eos = getattr(tokenizer, "eos_token_id", None)
    tokens: frozenset[int] = frozenset()
    strings: tuple[str, ...] = ()
    if stop is None:
        tokens = frozenset([eos]) if eos is not None else frozenset()
    elif isinstance(stop, str):
        strings = (stop,)
    elif all(isinstance(s, int) for s in stop):
        tokens = frozenset(int(s) for s in stop)
    else:
        strings = tuple(str(s) for s in stop)
    if sp.temperature < 0 or not 0 < sp.top_p <= 1:
        raise RequestError(
            f"sampling_params: temperature must be >= 0 and top_p in (0, 1] (got "
            f"{sp.temperature}, {sp.top_p})"
        )
    max_tokens = sp.max_tokens if sp.max_tokens is not None else DEFAULT_MAX_TOKENS
    if max_tokens < 1:
        raise RequestError(f"sampling_params.max_tokens must be >= 1 (got {max_tokens})")
    return DecodeParams(
        max_tokens=max_tokens,
        temperature=sp.temperature,
        top_k=max(sp.top_k, 0),
        top_p=sp.top_p,
        seed=sp.seed,
        stop_tokens=tokens,
        stop_strings=strings,
        decode_text=tokenizer.decode if strings else None,
    )


class TinkerServer:
    """Uvicorn serving the app on its own thread and event loop (start, url, close)."""

    def __init__(self, service: TinkerService, host: str = "127.0.0.1", port: int = 0) -> None:
        self.service = service
        self.host, self.port = host, port
        self.url = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 30.0) -> str:
        uvicorn = require("uvicorn", "tinker", "the Tinker server")
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((self.host, self.port))
        config = uvicorn.Config(
            create_app(self.service), log_level="warning", access_log=False, lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve(sockets=[sock])),
            name="tinker-http",
            daemon=True,
        )
        self._thread.start()
        for _ in range(int(timeout / 0.01)):
            if self._server.started or not self._thread.is_alive():
                break
            threading.Event().wait(0.01)
        if not self._server.started:
            raise OSError(f"the Tinker server did not start on {self.host}:{self.port}")
        host, port = sock.getsockname()[:2]
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        return self.url

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        with contextlib.suppress(Exception):
            self.service.close()
