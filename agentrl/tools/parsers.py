"""Tool-call parsers: model text -> calls, plus short error observations for bad calls.

Parsers live in a registry keyed by name so a config can pick one and a user can add a
format without editing this file::

    @register_parser("my_format")
    def parse_my_format(text: str) -> list[ToolCall | MalformedCall]: ...

A parser returns, in the order they appear, every call the text *attempted*: a
:class:`~agentrl.tools.base.ToolCall` when it could be read, a :class:`MalformedCall`
(raw text + error observation) when it could not. Built-ins:

* ``hermes`` -- ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, several
  per turn; a final block left unclosed (the model stopped right after the JSON) is read too.
* ``python_fence`` -- each fenced code block tagged ``python`` becomes a ``python`` call
  (small models often write code blocks instead of tool calls).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrl._suggest import suggest
from agentrl.errors import UnknownNameError
from agentrl.tools.base import ToolCall


@dataclass
class MalformedCall:
    """A call the model attempted but that could not be read."""

    raw: str
    error: str  # the observation shown to the model, "error: ..."


ParsedCall = ToolCall | MalformedCall
Parser = Callable[[str], list[ParsedCall]]

_PARSERS: dict[str, Parser] = {}


def register_parser(name: str) -> Callable[[Parser], Parser]:
    """Decorator: register a parser under ``name`` (replacing one of the same name)."""

    def deco(fn: Parser) -> Parser:
        _PARSERS[name] = fn
        return fn

    return deco


def get_parser(name: str) -> Parser:
    try:
        return _PARSERS[name]
    except KeyError:
        raise UnknownNameError(
            f"unknown tool-call parser {name!r}{suggest(name, _PARSERS)}; "
            f"registered parsers: {', '.join(sorted(_PARSERS))}"
        ) from None


def parser_names() -> list[str]:
    return sorted(_PARSERS)


def parse_tool_calls(text: str, parser: str = "hermes") -> tuple[list[ToolCall], list[str]]:
    """The calls that could be read, and an error observation for each that could not."""
    items = get_parser(parser)(text)
    calls = [c for c in items if isinstance(c, ToolCall)]
    errors = [c.error for c in items if isinstance(c, MalformedCall)]
    return calls, errors


# --- hermes ---------------------------------------------------------------------------

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n?(.*?)\n?```$", re.DOTALL)


@register_parser("hermes")
def parse_hermes(text: str) -> list[ParsedCall]:
    out: list[ParsedCall] = []
    pos = 0
    while (start := text.find(_OPEN, pos)) != -1:
        body_start = start + len(_OPEN)
        end = text.find(_CLOSE, body_start)
        nxt = text.find(_OPEN, body_start)
        if end == -1 or (nxt != -1 and nxt < end):  # unclosed block
            stop = nxt if nxt != -1 else len(text)
            raw, pos = text[start:stop], stop
            out.append(_call_from_json(text[body_start:stop], raw, closed=False))
        else:
            raw, pos = text[start : end + len(_CLOSE)], end + len(_CLOSE)
            out.append(_call_from_json(text[body_start:end], raw, closed=True))
    return out


def _call_from_json(body: str, raw: str, closed: bool) -> ParsedCall:
    body = body.strip()
    if fenced := _FENCE.match(body):  # tolerate ```json ... ``` inside the tags
        body = fenced.group(1).strip()
    if not body:
        return MalformedCall(
            raw,
            'error: empty tool call: write {"name": ..., "arguments": {...}} inside <tool_call></tool_call>',
        )
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        hint = " (the JSON is incomplete)" if e.pos >= len(body) else ""
        hint += "" if closed else " (missing </tool_call>?)"
        return MalformedCall(
            raw,
            f"error: invalid JSON in tool call: {e.msg} at line {e.lineno} column {e.colno}{hint}",
        )
    return call_from_object(obj, raw)


def call_from_object(obj: Any, raw: str = "") -> ParsedCall:
    """Read ``{"name": ..., "arguments": {...}}`` (also OpenAI's ``{"function": {...}}``)."""
    if not isinstance(obj, dict):
        return MalformedCall(
            raw,
            'error: a tool call must be a JSON object {"name": ..., "arguments": {...}} '
            f"(got {_json_type(obj)})",
        )
    if "name" not in obj and isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name")
    if name is None:
        return MalformedCall(raw, "error: tool call is missing 'name'")
    if not isinstance(name, str) or not name.strip():
        return MalformedCall(
            raw, f"error: tool call 'name' must be a non-empty string (got {name!r})"
        )
    args = obj.get("arguments", obj.get("parameters", {}))
    if args is None:
        args = {}
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return MalformedCall(
                raw, f"error: invalid JSON in 'arguments' of tool '{name}': {e.msg}"
            )
    if not isinstance(args, dict):
        return MalformedCall(
            raw,
            f"error: 'arguments' of tool '{name}' must be a JSON object (got {_json_type(args)})",
        )
    return ToolCall(name=name.strip(), arguments=args, raw=raw)


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return names.get(type(value), type(value).__name__)


# --- python_fence -------------------------------------------------------------------

_PY_FENCE = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL)


@register_parser("python_fence")
def parse_python_fence(text: str) -> list[ParsedCall]:
    out: list[ParsedCall] = []
    for m in _PY_FENCE.finditer(text):
        code = m.group(1)
        if not code.strip():
            out.append(MalformedCall(m.group(0), "error: empty python code block"))
        else:
            out.append(ToolCall(name="python", arguments={"code": code}, raw=m.group(0)))
    return out
