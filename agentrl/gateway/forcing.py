"""Forcing a tool call: ``tool_choice`` required / a named function, by a forced opening.

A request that must call a tool (OpenAI ``tool_choice: "required"`` or
``{"type": "function", "function": {"name": ...}}``; Anthropic ``any`` / ``tool``) gets the
tool-call syntax of the run's parser written into the reply before the model continues:
``<tool_call>\\n`` for Hermes, and ``{"name": "<fn>", "arguments": `` after it when a
function is named. The forced tokens are fed to the sampler after the prompt; the model
samples the rest (the function's name when not named, the arguments, the closing tag)
conditioned on them, so those tokens and their behaviour log-probs are exactly the model's.

The recorder keeps the forced tokens at the head of the turn's model segment with
``Segment.forced`` = their count: log-prob 0 (probability 1 under the constraint), the
version of the weights that continued them, and no loss (see docs/gateway.md, "Forcing a
tool call"). What the model then writes is parsed as any reply: a call that does not parse
stays in the content, as the model wrote it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from agentrl.gateway.protocol import OpenAIError, bad_request
from agentrl.samplers.base import Generation

# parser -> (opening of any call, opening of a call to one named function)
OPENINGS: dict[str, tuple[str, str]] = {
    "hermes": ("<tool_call>\n", '<tool_call>\n{{"name": {name}, "arguments": '),
}
# parser -> the text that ends one call: parallel_tool_calls=false stops sampling there
CLOSINGS: dict[str, str] = {"hermes": "</tool_call>"}


def forced_name(tool_choice: Any, tool_names: list[str]) -> tuple[bool, str | None]:
    """(must call, the named function or None) for an OpenAI chat ``tool_choice``."""
    if tool_choice in (None, "auto", "none"):
        return False, None
    if tool_choice == "required":
        if not tool_names:
            raise bad_request("tool_choice='required' needs tools", param="tool_choice")
        return True, None
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise bad_request(
                "tool_choice {'type': 'function'} needs function.name", param="tool_choice"
            )
        if name not in tool_names:
            raise bad_request(
                f"tool_choice names the function {name!r}, which is not among the request's "
                f"tools ({', '.join(tool_names) or 'none'})",
                param="tool_choice",
            )
        return True, name
    raise OpenAIError(
        400,
        f"tool_choice: {tool_choice!r} is not one of 'auto', 'none', 'required' or "
        "{'type': 'function', 'function': {'name': ...}}",
        param="tool_choice",
        code="unsupported_parameter",
    )


def opening_text(parser: str, name: str | None) -> str:
    """The text a forced call starts with under `parser` (400 for parsers without one)."""
    if parser not in OPENINGS:
        raise OpenAIError(
            400,
            f"tool_choice: forcing a call needs a tool-call syntax to force; the gateway's "
            f"tool parser {parser!r} has none (forcing works with: {', '.join(OPENINGS)})",
            param="tool_choice",
            code="unsupported_parameter",
        )
    any_call, named = OPENINGS[parser]
    return any_call if name is None else named.format(name=json.dumps(name))


def single_call_stop(parser: str) -> str:
    """The stop string that ends a reply after its first call (parallel_tool_calls=false):
    the turn is then closed by the template's suffix, a masked observation token."""
    if parser not in CLOSINGS:
        raise OpenAIError(
            400,
            f"parallel_tool_calls: false needs to know where a call ends; the gateway's tool "
            f"parser {parser!r} does not say (it works with: {', '.join(CLOSINGS)})",
            param="parallel_tool_calls",
            code="unsupported_parameter",
        )
    return CLOSINGS[parser]


def with_forced(gen: Generation, forced_ids: list[int], version: int) -> Generation:
    """`gen` (sampled after the forced ids) with the forced ids at its head."""
    if not forced_ids:
        return gen
    v = gen.versions[0] if gen.versions else version
    entropies = [0.0] * len(forced_ids) + gen.entropies if gen.entropies is not None else None
    return replace(
        gen,
        token_ids=[*forced_ids, *gen.token_ids],
        logprobs=[0.0] * len(forced_ids) + list(gen.logprobs),
        versions=[v] * len(forced_ids) + list(gen.versions),
        entropies=entropies,
        metadata={**gen.metadata, "forced_tokens": len(forced_ids)},
    )
