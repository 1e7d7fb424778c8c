"""The OpenAI Responses API on the gateway: ``POST /v1/responses``.

A Responses request is converted to the gateway's chat form and served by
:meth:`Gateway.chat`, so it is recorded exactly as a chat completion (same session,
renderer, prefix joining, limits). The conversion:

* ``instructions`` is the system message (not carried over from a previous response, as
  OpenAI does); ``input`` is a string (one user message) or a list of items:
  ``message`` items (roles user, system, developer, assistant; ``input_text`` /
  ``output_text`` parts), ``function_call`` and ``function_call_output`` items;
* an assistant ``message`` and the ``function_call`` items after it are one assistant
  turn (how a reply of this gateway comes out), so echoed replies match what was sampled;
* ``previous_response_id`` (within the session) puts that response's conversation (its
  input and output, without its instructions) before the new input: the session keeps
  each response's conversation server-side;
* function ``tools``, ``tool_choice`` (auto, none, required, a named function: forced as
  in :mod:`agentrl.gateway.forcing`), ``parallel_tool_calls``, ``max_output_tokens``,
  ``temperature``, ``top_p``.

Refused with a 400 naming the field: images and files, reasoning and other item types,
hosted tools (web search, file search, shell, custom tools), structured outputs,
``background``, ``conversation``, ``truncation: auto``, ``top_logprobs``, unknown fields.
``reasoning`` and ``include`` are accepted: the policy writes no reasoning items.
"""

from __future__ import annotations

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
    bad_request,
    unsupported,
)
from agentrl.gateway.recorder import Session
from agentrl.gateway.service import Completed, Gateway

KEPT_RESPONSES = 256  # conversations kept per session for previous_response_id


class Item(BaseModel):
    # message / function_call / function_call_output items; read by type below
    model_config = ConfigDict(extra="allow")
    type: str | None = None
    role: str | None = None


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    input: str | list[Item] = Field(min_length=1)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    background: bool | None = None
    conversation: Any = None
    reasoning: dict[str, Any] | None = None  # accepted: no reasoning items are written
    include: list[str] | None = None
    # labels only: accepted, no effect on sampling
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    client_metadata: dict[str, Any] | None = None  # Codex CLI sends its installation id
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    service_tier: str | None = None

    def check_supported(self) -> None:
        if self.top_logprobs:
            raise unsupported("top_logprobs", "only the sampled tokens' log-probs are recorded")
        if self.background:
            raise unsupported("background", "responses are answered in the request")
        if self.conversation is not None:
            raise unsupported("conversation", "use previous_response_id or send the items")
        if self.truncation == "auto":
            raise unsupported("truncation", "'auto' would drop items the model saw; omit it")
        fmt = (self.text or {}).get("format") or {}
        if fmt.get("type", "text") != "text":
            raise unsupported("text.format", "only {'type': 'text'} (no guided decoding)")

    @property
    def logprobs(self) -> bool:
        return "message.output_text.logprobs" in (self.include or [])


# --- items -> chat ---------------------------------------------------------------------------


def _part_text(part: Any, where: str) -> str:
    if isinstance(part, dict) and part.get("type") in ("input_text", "output_text", "text"):
        return str(part.get("text") or "")
    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
    raise unsupported(where, f"content part type {kind!r} (the gateway serves text only)")


def _text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        return "".join(_part_text(p, f"{where}.{k}") for k, p in enumerate(content))
    raise unsupported(where, "content must be a string or a list of text parts")


def _field(item: Item, name: str, where: str) -> Any:
    value = getattr(item, name, None)
    if value is None:
        raise bad_request(f"Missing required parameter: '{where}.{name}'.", param=f"{where}.{name}")
    return value


def to_messages(items: str | list[Item]) -> list[ChatMessage]:
    """The chat messages of Responses input items (see the module doc)."""
    if isinstance(items, str):
        return [ChatMessage(role="user", content=items)]
    out: list[ChatMessage] = []
    turn: dict[str, Any] | None = None  # the assistant turn being gathered

    def flush() -> None:
        nonlocal turn
        if turn is not None:
            out.append(ChatMessage.model_validate({"role": "assistant", **turn}))
            turn = None

    for k, item in enumerate(items):
        where = f"input.{k}"
        kind = item.type or ("message" if item.role else None)
        if kind == "message" and item.role == "assistant":
            if turn is not None and turn["tool_calls"]:
                flush()  # text after calls starts the next turn
            turn = turn or {"content": "", "tool_calls": []}
            turn["content"] += _text(getattr(item, "content", None), f"{where}.content")
        elif kind == "function_call":
            turn = turn or {"content": "", "tool_calls": []}
            name, call_id = _field(item, "name", where), _field(item, "call_id", where)
            arguments = getattr(item, "arguments", "") or ""
            turn["tool_calls"].append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            )
        elif kind == "function_call_output":
            flush()
            text = _text(getattr(item, "output", ""), f"{where}.output")
            call_id = _field(item, "call_id", where)
            out.append(ChatMessage(role="tool", content=text, tool_call_id=call_id))
        elif kind == "message":
            flush()
            role = item.role
            if role not in ("user", "system", "developer"):
                raise bad_request(
                    f"Invalid value for '{where}.role': {role!r} (user, system, developer or "
                    "assistant).",
                    param=f"{where}.role",
                )
            content = _text(getattr(item, "content", None), f"{where}.content")
            out.append(ChatMessage(role=role, content=content))  # type: ignore[arg-type]
        else:
            raise unsupported(
                f"{where}.type",
                f"input item type {kind!r} (message, function_call and function_call_output "
                "only; the gateway writes no reasoning items)",
            )
    flush()
    return out


def _tools(tools: list[dict[str, Any]] | None) -> list[ToolDef] | None:
    if not tools:
        return None
    out = []
    for k, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise unsupported(
                f"tools.{k}.type", f"tool type {tool.get('type')!r} (function tools only)"
            )
        try:
            fn = FunctionDef(
                name=tool.get("name", ""),
                description=tool.get("description"),
                parameters=tool.get("parameters"),
                strict=tool.get("strict"),
            )
        except ValueError as e:
            raise bad_request(f"Invalid value for 'tools.{k}': {e}", param=f"tools.{k}") from None
        out.append(ToolDef(type="function", function=fn))
    return out


def _tool_choice(choice: str | dict[str, Any] | None) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice  # auto / none / required; others get the chat path's 400


def to_chat(req: ResponsesRequest, history: list[ChatMessage]) -> ChatCompletionRequest:
    """The chat request that serves (and records) `req` after `history`."""
    req.check_supported()
    messages = list(history) + to_messages(req.input)
    if req.instructions:
        messages.insert(0, ChatMessage(role="system", content=req.instructions))
    return ChatCompletionRequest(
        model=req.model,
        messages=messages,
        tools=_tools(req.tools),
        tool_choice=_tool_choice(req.tool_choice),
        parallel_tool_calls=req.parallel_tool_calls,
        max_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
    )


def history_of(session: Session, req: ResponsesRequest) -> list[ChatMessage]:
    if req.previous_response_id is None:
        return []
    found = session.responses.get(req.previous_response_id)
    if found is None:
        raise bad_request(
            f"Previous response with id '{req.previous_response_id}' not found (responses "
            "are kept per session: the same key, this episode)",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return found


def remember(
    session: Session, rid: str, req: ResponsesRequest, chat: ChatCompletionRequest, done: Completed
) -> None:
    """Keep the response's conversation (without instructions) for previous_response_id."""
    messages = list(chat.messages)[1:] if req.instructions else list(chat.messages)
    messages.append(ChatMessage.model_validate(done.replies[0].message()))
    session.responses[rid] = messages
    while len(session.responses) > KEPT_RESPONSES:
        session.responses.pop(next(iter(session.responses)))


# --- chat -> Responses -----------------------------------------------------------------------


def _output(gateway: Gateway, done: Completed, req: ResponsesRequest) -> list[dict[str, Any]]:
    reply, gen = done.replies[0], done.gens[0]
    items: list[dict[str, Any]] = []
    if reply.content:
        part: dict[str, Any] = {"type": "output_text", "text": reply.content, "annotations": []}
        if req.logprobs:
            part["logprobs"] = gateway.token_logprobs(gen)["content"]
        items.append(
            {
                "id": f"msg_{uuid.uuid4().hex[:24]}",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
        )
    for call in reply.tool_calls:
        items.append(
            {
                "id": f"fc_{uuid.uuid4().hex[:24]}",
                "type": "function_call",
                "status": "completed",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
            }
        )
    return items


def response_body(
    gateway: Gateway, done: Completed, req: ResponsesRequest, rid: str
) -> dict[str, Any]:
    cut = done.gens[0].finish_reason == "length" and not done.replies[0].tool_calls
    output_tokens = len(done.gens[0].token_ids)
    return {
        "id": rid,
        "object": "response",
        "created_at": done.created,
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "model": req.model,
        "output": _output(gateway, done, req),
        "instructions": req.instructions,
        "tools": req.tools or [],
        "tool_choice": req.tool_choice or "auto",
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "max_output_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "metadata": req.metadata or {},
        "store": req.store is not False,
        "usage": {
            "input_tokens": len(done.prompt_ids),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": len(done.prompt_ids) + output_tokens,
        },
    }


def response_events(
    gateway: Gateway, done: Completed, req: ResponsesRequest, rid: str
) -> Iterator[dict[str, Any]]:
    """The response as Responses stream events (sampled whole, then sent item by item;
    text token by token where it is exactly the decoded tokens)."""
    body = response_body(gateway, done, req, rid)
    seq = iter(range(1 << 30))
    pending = {**body, "status": "in_progress", "output": [], "incomplete_details": None}
    yield {"type": "response.created", "sequence_number": next(seq), "response": pending}
    yield {"type": "response.in_progress", "sequence_number": next(seq), "response": pending}
    for index, item in enumerate(body["output"]):
        at = {"output_index": index, "item_id": item["id"]}
        if item["type"] == "message":
            (part,) = item["content"]
            added = {**item, "status": "in_progress", "content": []}
            yield {
                "type": "response.output_item.added",
                "sequence_number": next(seq),
                "output_index": index,
                "item": added,
            }
            empty = {"type": "output_text", "text": "", "annotations": []}
            yield {
                "type": "response.content_part.added",
                "sequence_number": next(seq),
                **at,
                "content_index": 0,
                "part": empty,
            }
            pieces = gateway.pieces(done.gens[0], part["text"]) or [part["text"]]
            lps = part.get("logprobs")
            for k, piece in enumerate(pieces):
                if not piece:
                    continue
                lp = [lps[k]] if lps is not None and len(pieces) == len(lps) else []
                yield {
                    "type": "response.output_text.delta",
                    "sequence_number": next(seq),
                    **at,
                    "content_index": 0,
                    "delta": piece,
                    "logprobs": lp,
                }
            yield {
                "type": "response.output_text.done",
                "sequence_number": next(seq),
                **at,
                "content_index": 0,
                "text": part["text"],
                "logprobs": lps or [],
            }
            yield {
                "type": "response.content_part.done",
                "sequence_number": next(seq),
                **at,
                "content_index": 0,
                "part": part,
            }
        else:
            added = {**item, "status": "in_progress", "arguments": ""}
            yield {
                "type": "response.output_item.added",
                "sequence_number": next(seq),
                "output_index": index,
                "item": added,
            }
            yield {
                "type": "response.function_call_arguments.delta",
                "sequence_number": next(seq),
                **at,
                "delta": item["arguments"],
            }
            yield {
                "type": "response.function_call_arguments.done",
                "sequence_number": next(seq),
                **at,
                "name": item["name"],
                "arguments": item["arguments"],
            }
        yield {
            "type": "response.output_item.done",
            "sequence_number": next(seq),
            "output_index": index,
            "item": item,
        }
    last = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
    yield {"type": last, "sequence_number": next(seq), "response": body}


# --- the route -------------------------------------------------------------------------------


def add_routes(app: Any, gateway: Gateway, prefixes: tuple[str, ...]) -> None:
    """``POST <prefix>/responses`` on `app`."""

    async def responses(request: Request, key: str | None = None) -> Any:
        req = await parse(request, ResponsesRequest)
        session = gateway.session_for(key_of(request, key))
        history = history_of(session, req)
        chat = to_chat(req, history)
        done = await gateway.chat(session, chat)
        rid = f"resp_{uuid.uuid4().hex[:24]}"
        remember(session, rid, req, chat, done)
        if req.stream:
            return sse(response_events(gateway, done, req, rid), named=True)
        return JSONResponse(response_body(gateway, done, req, rid))

    for prefix in prefixes:
        app.add_api_route(f"{prefix}/responses", responses, methods=["POST"])
