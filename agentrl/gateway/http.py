"""What every API's routes share: the web framework (imported here once, with the error
that names the ``gateway`` extra when it is missing), the JSON body, the session key,
server-sent events."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

from pydantic import BaseModel, ValidationError

from agentrl.extras import require

try:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException
except ModuleNotFoundError:
    require("fastapi", "gateway", "the gateway server")  # MissingExtra when fastapi is absent
    raise
from agentrl.gateway.protocol import bad_request, from_validation

__all__ = ["FastAPI", "HTTPException", "JSONResponse", "Request", "key_of", "parse", "sse"]


async def parse(request: Request, model: type[BaseModel]) -> Any:
    """The request body as `model` (400 naming the field otherwise)."""
    try:
        payload = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    if not isinstance(payload, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        return model.model_validate(payload)
    except ValidationError as e:
        raise from_validation(e) from None


def key_of(request: Request, path_key: str | None) -> str | None:
    """The session key: in the path, else ``Authorization: Bearer``, else ``x-api-key``."""
    if path_key:
        return path_key
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key") or None


def sse(events: Iterable[dict[str, Any]], *, named: bool = False, done: bool = False) -> Any:
    """`events` as server-sent events: ``event: <type>`` lines when `named` (Anthropic,
    Responses), a final ``data: [DONE]`` when `done` (chat completions)."""

    async def body() -> AsyncIterator[bytes]:
        for event in events:
            head = f"event: {event['type']}\n".encode() if named else b""
            yield head + b"data: " + json.dumps(event).encode() + b"\n\n"
        if done:
            yield b"data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")
