"""The gateway over HTTP: FastAPI routes and a uvicorn server in the run's event loop.

Routes (each also under ``/s/<key>/v1/...``, the per-episode base URL):

    POST /v1/chat/completions     non-streaming and streaming (SSE)
    POST /v1/completions
    POST /v1/messages             Anthropic Messages (agentrl.gateway.anthropic_api)
    POST /v1/messages/count_tokens
    POST /v1/responses            OpenAI Responses (agentrl.gateway.responses_api)
    GET  /v1/models
    GET  /health

The session is the key in the path, else the ``Authorization: Bearer <key>`` header, else
``x-api-key``. Every error is OpenAI-shaped, ``{"error": {"message", "type", "param",
"code"}}``, with its HTTP status; on the Messages routes it is Anthropic-shaped.
:func:`run_gateway` opens the server once per run in the run's
:class:`~agentrl.resources.ResourceScope`, so every entry point closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

from agentrl.extras import require
from agentrl.gateway import anthropic_api, responses_api
from agentrl.gateway.http import FastAPI, HTTPException, JSONResponse, Request, key_of, parse, sse
from agentrl.gateway.protocol import ChatCompletionRequest, CompletionRequest, OpenAIError
from agentrl.gateway.service import Gateway, GatewaySettings
from agentrl.resources import ResourceScope
from agentrl.samplers.base import Sampler

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
SCOPE_KEY = "agentrl.gateway"


def create_app(gateway: Gateway) -> Any:
    """The FastAPI application serving `gateway`."""
    app = FastAPI(title="agentrl gateway", docs_url=None, redoc_url=None, openapi_url=None)

    def answer(request: Request, err: OpenAIError) -> JSONResponse:
        if anthropic_api.is_anthropic(request.url.path):
            body = anthropic_api.error_body(err.status, err.message)
        else:
            body = err.body()
        return JSONResponse(body, status_code=err.status)

    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
        gateway.stats.errors += 1
        return answer(request, exc)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return answer(request, OpenAIError(exc.status_code, message, type=kind, code=code))  # type: ignore[arg-type]

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        gateway.stats.errors += 1
        err = OpenAIError(
            500, f"the gateway failed: {exc!r}", type="server_error", code="internal_error"
        )
        return answer(request, err)

    def serve(api: type[Any], call: Any, body: Any, chunks: Any) -> Any:
        """A route of one OpenAI API: parse, serve in the key's session, answer or stream."""

        async def route(request: Request, key: str | None = None) -> Any:
            req = await parse(request, api)
            done = await call(gateway.session_for(key_of(request, key)), req)
            if req.stream:
                return sse(chunks(done, req), done=True)
            return JSONResponse(body(done, req))

        return route

    chat = serve(ChatCompletionRequest, gateway.chat, gateway.chat_body, gateway.chat_chunks)
    completions = serve(
        CompletionRequest, gateway.complete, gateway.completion_body, gateway.completion_chunks
    )

    async def models(request: Request, key: str | None = None) -> Any:
        return JSONResponse(gateway.models_body())

    async def health() -> Any:
        return {"status": "ok", "sessions": len(gateway.sessions), "calls": gateway.stats.calls}

    prefixes = ("/v1", "/s/{key}/v1")
    for prefix in prefixes:
        app.add_api_route(f"{prefix}/chat/completions", chat, methods=["POST"])
        app.add_api_route(f"{prefix}/completions", completions, methods=["POST"])
        app.add_api_route(f"{prefix}/models", models, methods=["GET"])
    anthropic_api.add_routes(app, gateway, prefixes)
    responses_api.add_routes(app, gateway, prefixes)
    app.add_api_route("/health", health, methods=["GET"])
    return app


def _quiet_server(config: Any) -> Any:
    uvicorn = require("uvicorn", "gateway", "the gateway server")

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:  # the host program owns Ctrl-C
            yield

    return _Server(config)


class GatewayServer:
    """A uvicorn server for one :class:`Gateway`, started and stopped by its owner."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> str:
        """Listen (a free port when the settings say 0) and return the base URL."""
        uvicorn = require("uvicorn", "gateway", "the gateway server")
        s = self.gateway.settings
        sock = socket.socket(socket.AF_INET6 if ":" in s.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # accepted connections inherit it: without it a small response waits ~40 ms for
        # the client's delayed ACK (Nagle), which was most of a call's added latency
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((s.host, s.port))
        config = uvicorn.Config(
            create_app(self.gateway),
            log_level="warning",
            access_log=False,
            lifespan="off",
            backlog=4096,
            timeout_keep_alive=60,
        )
        self._server = _quiet_server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._until_started(), START_TIMEOUT_S)
        if not self._server.started:
            await self.close()
            raise OSError(f"the gateway did not start on {s.host}:{s.port}")
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        self.gateway.base_url = f"http://{shown}:{port}"
        return self.gateway.base_url

    async def _until_started(self) -> None:
        while not self._server.started:
            if self._task is not None and self._task.done():
                self._task.result()  # raises the server's start-up error
                return
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        """Stop serving (new calls get 503 meanwhile) and wait for the server to exit."""
        self.gateway.closing = True
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), STOP_TIMEOUT_S)
        except asyncio.TimeoutError:
            self._server.force_exit = True
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        except Exception:  # a server that crashed earlier: nothing left to stop
            pass
        self._task = None


async def run_gateway(scope: ResourceScope, sampler: Sampler, settings: GatewaySettings) -> Gateway:
    """The run's gateway: started on first use, closed with `scope`."""

    async def open_gateway(stack: contextlib.AsyncExitStack) -> Gateway:
        server = GatewayServer(Gateway(sampler, settings))
        await server.start()
        stack.push_async_callback(server.close)
        return server.gateway

    return await scope.get_or_create(SCOPE_KEY, open_gateway)
