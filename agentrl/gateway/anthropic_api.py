"""The Anthropic Messages API on the gateway: ``POST /v1/messages`` and ``count_tokens``.

A Messages request is converted to the gateway's chat form (:class:`ChatCompletionRequest`)
and served by :meth:`Gateway.chat`, so it is recorded exactly as a chat completion: the
same session (key in the path, ``x-api-key`` or ``Authorization: Bearer``), the same
renderer, prefix joining, limits and trajectories. The conversion:

* ``system`` (a string or text blocks, joined by blank lines) is the system message;
* a user message's ``tool_result`` blocks become ``tool`` messages (``tool_use_id`` is
  the ``tool_call_id``), its text blocks one user message;
* an assistant message's text blocks are its content and its ``tool_use`` blocks its
  tool calls, so the reply the gateway returned matches the one the agent echoes back;
* ``tools`` (custom tools: name, description, input_schema) are function tools;
  ``tool_choice`` auto / none / any / tool map to auto / none / required / a named
  function (any and tool force a call: :mod:`agentrl.gateway.forcing`).

Refused with an Anthropic-shaped 400 (``{"type": "error", "error": {"type":
"invalid_request_error", "message"}}``): images and documents, thinking blocks and
``thinking`` enabled, server tools, structured outputs, unknown fields.
``disable_parallel_tool_use`` stops the reply after its first call (as chat's
``parallel_tool_calls: false``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentrl.gateway.http import JSONResponse, Request, key_of, parse, sse
from agentrl.gateway.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionDef,
    ToolDef,
    unsupported,
)
from agentrl.gateway.service import Completed, Gateway

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def is_anthropic(path: str) -> bool:
    """Whether `path` is under the Messages API (its errors take Anthropic's shape)."""
    return "/v1/messages" in path


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


# --- the wire format ---------------------------------------------------------------------


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Block(BaseModel):
    # text, tool_use, tool_result (+ cache_control, citations): read by type below
    model_config = ConfigDict(extra="allow")
    type: str


class Message(_Wire):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(BaseModel):
    model_config = ConfigDict(extra="allow")  # cache_control
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    type: str | None = None


class ToolChoice(_Wire):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str


class CountTokensRequest(_Wire):
    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[Block] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    output_config: dict[str, Any] | None = None  # effort: a label; format: refused
    # labels only: accepted, no effect on sampling (prompt caching, routing, accounting)
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    cache_control: dict[str, Any] | None = None
    diagnostics: dict[str, Any] | None = None
    inference_geo: str | None = None
    speed: str | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None


# --- Messages -> chat ----------------------------------------------------------------------


def _text(block: Block, where: str) -> str:
    if block.type == "text":
        return str(getattr(block, "text", "") or "")
    if block.type in ("image", "document"):
        raise unsupported(where, f"{block.type} blocks (the gateway serves text only)")
    if block.type in ("thinking", "redacted_thinking"):
        raise unsupported(where, f"{block.type} blocks (the gateway never returns thinking)")
    raise unsupported(where, f"content block type {block.type!r} here")


def _texts(blocks: list[Block], where: str, sep: str = "\n") -> str:
    return sep.join(_text(b, where) for b in blocks)


def _user(i: int, content: str | list[Block]) -> list[ChatMessage]:
    if isinstance(content, str):
        return [ChatMessage(role="user", content=content)]
    out: list[ChatMessage] = []
    texts: list[str] = []
    for j, block in enumerate(content):
        where = f"messages.{i}.content.{j}"
        if block.type == "tool_result":
            if texts:
                out.append(ChatMessage(role="user", content="\n".join(texts)))
                texts = []
            result = getattr(block, "content", "")
            if isinstance(result, list):
                result = _texts([Block.model_validate(b) for b in result], f"{where}.content")
            use_id = getattr(block, "tool_use_id", None)
            if not isinstance(use_id, str):
                raise unsupported(f"{where}.tool_use_id", "a tool_result needs its tool_use_id")
            out.append(ChatMessage(role="tool", content=str(result or ""), tool_call_id=use_id))
        else:
            texts.append(_text(block, where))
    if texts or not out:
        out.append(ChatMessage(role="user", content="\n".join(texts)))
    return out


def _assistant(i: int, content: str | list[Block]) -> ChatMessage:
    if isinstance(content, str):
        return ChatMessage(role="assistant", content=content)
    texts, calls = [], []
    for j, block in enumerate(content):
        if block.type == "tool_use":
            args = getattr(block, "input", {})
            calls.append(
                {
                    "id": getattr(block, "id", ""),
                    "type": "function",
                    "function": {"name": getattr(block, "name", ""), "arguments": json.dumps(args)},
                }
            )
        else:
            texts.append(_text(block, f"messages.{i}.content.{j}"))
    return ChatMessage(role="assistant", content="".join(texts), tool_calls=calls or None)


def _tool_choice(choice: ToolChoice | None) -> Any:
    if choice is None:
        return None
    if choice.type == "tool":
        if not choice.name:
            raise unsupported("tool_choice.name", "tool_choice type 'tool' needs the tool's name")
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "none": "none", "any": "required"}[choice.type]


def _tools(tools: list[Tool] | None) -> list[ToolDef] | None:
    if not tools:
        return None
    out = []
    for k, tool in enumerate(tools):
        if tool.type not in (None, "custom"):
            raise unsupported(f"tools.{k}.type", f"server tool {tool.type!r} (custom tools only)")
        fn = FunctionDef(name=tool.name, description=tool.description, parameters=tool.input_schema)
        out.append(ToolDef(type="function", function=fn))
    return out


def to_chat(req: CountTokensRequest) -> ChatCompletionRequest:
    """The chat request that serves (and records) `req`."""
    # adaptive lets the model decide whether to think: answering without thinking honours it
    if req.thinking is not None and req.thinking.type not in ("disabled", "adaptive"):
        raise unsupported(
            "thinking", f"type {req.thinking.type!r}: thinking is not served; omit or disable it"
        )
    if isinstance(req, MessagesRequest) and (req.output_config or {}).get("format"):
        raise unsupported("output_config.format", "structured outputs need guided decoding")
    messages: list[ChatMessage] = []
    if req.system:
        system = req.system if isinstance(req.system, str) else _texts(req.system, "system", "\n\n")
        messages.append(ChatMessage(role="system", content=system))
    for i, msg in enumerate(req.messages):
        if msg.role == "user":
            messages.extend(_user(i, msg.content))
        else:
            messages.append(_assistant(i, msg.content))
    sampling: dict[str, Any] = {}
    if isinstance(req, MessagesRequest):
        if len(req.stop_sequences or []) > 4 or "" in (req.stop_sequences or []):
            raise unsupported("stop_sequences", "up to 4 non-empty strings")
        sampling = {
            "max_tokens": req.max_tokens,
            "stop": req.stop_sequences or None,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "top_k": req.top_k,
        }
    one_call = req.tool_choice is not None and req.tool_choice.disable_parallel_tool_use
    return ChatCompletionRequest(
        model=req.model,
        messages=messages,
        tools=_tools(req.tools),
        tool_choice=_tool_choice(req.tool_choice),
        parallel_tool_calls=False if one_call else None,
        **sampling,
    )


# --- chat -> Messages ------------------------------------------------------------------------


def _stop(done: Completed, req: MessagesRequest) -> tuple[str, str | None]:
    gen, reply = done.gens[0], done.replies[0]
    if reply.tool_calls:
        return "tool_use", None
    if gen.finish_reason == "length":
        return "max_tokens", None
    hit = [s for s in req.stop_sequences or [] if gen.finish_reason == "stop" and s in reply.text]
    if hit:
        return "stop_sequence", max(hit, key=reply.text.rfind)
    return "end_turn", None


def _content(done: Completed) -> list[dict[str, Any]]:
    reply = done.replies[0]
    blocks: list[dict[str, Any]] = []
    if reply.content:
        blocks.append({"type": "text", "text": reply.content})
    for call in reply.tool_calls:
        fn = call["function"]
        blocks.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": fn["name"],
                "input": json.loads(fn["arguments"]),
            }
        )
    return blocks


def _usage(done: Completed, output: bool = True) -> dict[str, int]:
    return {
        "input_tokens": len(done.prompt_ids),
        "output_tokens": len(done.gens[0].token_ids) if output else 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def message_body(done: Completed, req: MessagesRequest) -> dict[str, Any]:
    stop_reason, stop_sequence = _stop(done, req)
    return {
        "id": done.id,
        "type": "message",
        "role": "assistant",
        "model": req.model,
        "content": _content(done),
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": _usage(done),
    }


def message_events(
    gateway: Gateway, done: Completed, req: MessagesRequest
) -> Iterator[dict[str, Any]]:
    """The message as Anthropic's stream: sampled whole, then sent block by block (text
    token by token where it is exactly the decoded tokens)."""
    body = message_body(done, req)
    head = {**body, "content": [], "stop_reason": None, "stop_sequence": None}
    yield {"type": "message_start", "message": {**head, "usage": _usage(done, output=False)}}
    yield {"type": "ping"}
    for index, block in enumerate(body["content"]):
        if block["type"] == "text":
            yield {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "text", "text": ""},
            }
            pieces = gateway.pieces(done.gens[0], block["text"]) or [block["text"]]
            for piece in pieces:
                if piece:
                    delta = {"type": "text_delta", "text": piece}
                    yield {"type": "content_block_delta", "index": index, "delta": delta}
        else:
            start = {**block, "input": {}}
            yield {"type": "content_block_start", "index": index, "content_block": start}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            yield {"type": "content_block_delta", "index": index, "delta": delta}
        yield {"type": "content_block_stop", "index": index}
    yield {
        "type": "message_delta",
        "delta": {"stop_reason": body["stop_reason"], "stop_sequence": body["stop_sequence"]},
        "usage": {"output_tokens": body["usage"]["output_tokens"]},
    }
    yield {"type": "message_stop"}


# --- routes ----------------------------------------------------------------------------------


def add_routes(app: Any, gateway: Gateway, prefixes: tuple[str, ...]) -> None:
    """``POST <prefix>/messages`` and ``<prefix>/messages/count_tokens`` on `app`."""

    async def messages(request: Request, key: str | None = None) -> Any:
        req = await parse(request, MessagesRequest)
        chat_req = to_chat(req)
        session = gateway.session_for(key_of(request, key))
        done = await gateway.chat(session, chat_req, call_ids="toolu_")
        done.id = "msg_" + uuid.uuid4().hex[:24]
        if req.stream:
            return sse(message_events(gateway, done, req), named=True)
        return JSONResponse(message_body(done, req))

    async def count_tokens(request: Request, key: str | None = None) -> Any:
        req = await parse(request, CountTokensRequest)
        chat_req = to_chat(req)
        session = gateway.session_for(key_of(request, key))
        gateway.check_model(req.model)
        return JSONResponse({"input_tokens": gateway.count_tokens(session, chat_req)})

    for prefix in prefixes:
        app.add_api_route(f"{prefix}/messages", messages, methods=["POST"])
        app.add_api_route(f"{prefix}/messages/count_tokens", count_tokens, methods=["POST"])
