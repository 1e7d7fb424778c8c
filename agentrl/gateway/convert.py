"""Between OpenAI messages and the renderer's: request messages in, model text out.

Request messages become the plain ``{"role", "content"}`` messages :class:`ChatRenderer`
renders (``developer`` is a system message; tool results keep their ``tool_call_id``).
An assistant message the gateway itself returned is rendered as the text the model
wrote, never as the agent's copy of it: the agent sees OpenAI ``tool_calls``, the template
sees the model's own ``<tool_call>`` text, so a turn renders exactly as it was sampled.

Matching keys (:func:`message_key`) compare messages the way an agent may echo them back:
``None`` and ``""`` content are equal, tool-call arguments compare as parsed JSON.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from agentrl.gateway.protocol import ChatMessage
from agentrl.tools.base import ToolCall
from agentrl.tools.parsers import get_parser

Message = dict[str, Any]
MessageKey = tuple[Any, ...]


def _canonical_arguments(arguments: str | dict[str, Any]) -> str:
    if isinstance(arguments, dict):
        return json.dumps(arguments, sort_keys=True, ensure_ascii=False)
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, ensure_ascii=False)
    except (json.JSONDecodeError, TypeError):
        return arguments


def message_key(msg: ChatMessage) -> MessageKey:
    """What identifies a request message for prefix matching."""
    role = "system" if msg.role == "developer" else msg.role
    calls = tuple(
        (c.function.name, _canonical_arguments(c.function.arguments)) for c in msg.tool_calls or []
    )
    return (role, msg.text(), msg.name, msg.tool_call_id, calls)


def tools_key(tools: list[dict[str, Any]] | None) -> str:
    return json.dumps(tools or [], sort_keys=True)


@dataclass
class Reply:
    """One completion as the agent sees it, and the model's own text behind it."""

    text: str  # decoded sampled tokens: what the template renders for this turn
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    parsed: list[ToolCall] = field(default_factory=list)

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg

    def key(self) -> MessageKey:
        calls = tuple(
            (c["function"]["name"], _canonical_arguments(c["function"]["arguments"]))
            for c in self.tool_calls
        )
        return ("assistant", self.content or "", None, None, calls)


def reply_from_text(
    text: str, parse_tools: bool, parser: str = "hermes", call_ids: str = "call_"
) -> Reply:
    """Split model text into content and OpenAI ``tool_calls`` (calls that could not be
    read stay in the content, as the model wrote them)."""
    if not parse_tools:
        return Reply(text=text, content=text)
    calls = [c for c in get_parser(parser)(text) if isinstance(c, ToolCall)]
    if not calls:
        return Reply(text=text, content=text)
    content = text
    for call in calls:
        content = content.replace(call.raw, "", 1)
    tool_calls = [
        {
            "id": f"{call_ids}{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {
                "name": call.name,
                "arguments": json.dumps(call.arguments, ensure_ascii=False),
            },
        }
        for call in calls
    ]
    return Reply(text=text, content=content.strip() or None, tool_calls=tool_calls, parsed=calls)


def render_message(msg: ChatMessage, recorded: dict[MessageKey, str]) -> Message:
    """The renderer's message for a request message; `recorded` maps the keys of replies
    the gateway returned in this session to the model text they came from."""
    role = "system" if msg.role == "developer" else msg.role
    text = msg.text()
    if role == "assistant":
        key = message_key(msg)
        if key in recorded:
            return {"role": "assistant", "content": recorded[key]}
        out: Message = {"role": "assistant", "content": text}
        if msg.tool_calls:
            out["tool_calls"] = [
                {"type": "function", "function": c.function.model_dump()} for c in msg.tool_calls
            ]
        return out
    out = {"role": role, "content": text}
    if msg.name is not None:
        out["name"] = msg.name
    if msg.tool_call_id is not None:
        out["tool_call_id"] = msg.tool_call_id
    return out


def tool_schemas(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """Request tools as the chat template's tool list (OpenAI's own shape)."""
    if not tools:
        return None
    return [t.model_dump(exclude_none=True) for t in tools]
