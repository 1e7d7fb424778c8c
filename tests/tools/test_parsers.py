"""Tool-call parsing and validation on a corpus of well-formed and malformed calls."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field

from agentrl.errors import UnknownNameError
from agentrl.tools import (
    Tool,
    ToolCall,
    ToolContext,
    ToolOutput,
    get_parser,
    parse_tool_calls,
    parser_names,
    prepare_calls,
    register_parser,
)


class CodeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    code: str


class LookupArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str
    k: int = Field(3, ge=1, le=10)


class Code(Tool):
    name = "python"
    description = "run code"
    Args = CodeArgs

    async def call(self, args: BaseModel, ctx: ToolContext) -> ToolOutput:
        return ToolOutput("")


class Lookup(Tool):
    name = "lookup"
    description = "look up"
    Args = LookupArgs

    async def call(self, args: BaseModel, ctx: ToolContext) -> ToolOutput:
        return ToolOutput("")


TOOLS = [Code(), Lookup()]


def tc(body: str) -> str:
    return f"<tool_call>{body}</tool_call>"


# text -> the single error observation prepare_calls must produce for it
MALFORMED = {
    tc(
        '{"name": "python", "arguments": {"code": "print(1)"'
    ): "error: invalid JSON in tool call: Expecting ',' delimiter at line 1 column 52 (the JSON is incomplete)",
    tc(
        "{'name': 'python', 'arguments': {}}"
    ): "error: invalid JSON in tool call: Expecting property name enclosed in double quotes at line 1 column 2",
    tc(
        '{"name": "python", "arguments": {"code": "x"}} trailing'
    ): "error: invalid JSON in tool call: Extra data at line 1 column 48",
    tc(
        ""
    ): 'error: empty tool call: write {"name": ..., "arguments": {...}} inside <tool_call></tool_call>',
    tc(
        "   \n "
    ): 'error: empty tool call: write {"name": ..., "arguments": {...}} inside <tool_call></tool_call>',
    tc(
        '["python", {"code": "1"}]'
    ): 'error: a tool call must be a JSON object {"name": ..., "arguments": {...}} (got a list)',
    tc(
        '"python"'
    ): 'error: a tool call must be a JSON object {"name": ..., "arguments": {...}} (got a string)',
    tc('{"arguments": {"code": "1"}}'): "error: tool call is missing 'name'",
    tc(
        '{"name": 7, "arguments": {}}'
    ): "error: tool call 'name' must be a non-empty string (got 7)",
    tc(
        '{"name": "", "arguments": {}}'
    ): "error: tool call 'name' must be a non-empty string (got '')",
    tc(
        '{"name": "python", "arguments": ["print(1)"]}'
    ): "error: 'arguments' of tool 'python' must be a JSON object (got a list)",
    tc(
        '{"name": "python", "arguments": "print(1)"}'
    ): "error: invalid JSON in 'arguments' of tool 'python': Expecting value",
    tc(
        '{"name": "pyhton", "arguments": {"code": "1"}}'
    ): "error: unknown tool 'pyhton' (did you mean 'python'?)",
    tc(
        '{"name": "browser", "arguments": {}}'
    ): "error: unknown tool 'browser' (available: lookup, python)",
    tc('{"name": "python", "arguments": {}}'): "error: argument 'code' is required",
    tc('{"name": "python"}'): "error: argument 'code' is required",
    tc(
        '{"name": "python", "arguments": {"cod": "1"}}'
    ): "error: argument 'code' is required; unknown argument 'cod' (did you mean 'code'?)",
    tc(
        '{"name": "python", "arguments": {"code": 5}}'
    ): "error: argument 'code': input should be a valid string (got 5)",
    tc(
        '{"name": "lookup", "arguments": {"query": "x", "k": "many"}}'
    ): "error: argument 'k': input should be a valid integer, unable to parse string as an integer (got 'many')",
    tc(
        '{"name": "lookup", "arguments": {"query": "x", "k": 50}}'
    ): "error: argument 'k': input should be less than or equal to 10 (got 50)",
    tc(
        '{"name": "lookup", "arguments": {"query": null}}'
    ): "error: argument 'query': input should be a valid string (got None)",
    '<tool_call>{"name": "python", "arguments": {"code": "1"}': "error: invalid JSON in tool call: Expecting ',' delimiter at line 1 column 46 (the JSON is incomplete) (missing </tool_call>?)",
}


@pytest.mark.parametrize("text", list(MALFORMED))
def test_malformed_calls_become_precise_errors(text):
    prepared = prepare_calls("I will call a tool.\n" + text, TOOLS)
    assert prepared.attempted
    assert prepared.errors == [MALFORMED[text]]
    assert prepared.valid == []


def test_several_calls_in_order_with_errors_interleaved():
    text = (
        "First: "
        + tc('{"name": "python", "arguments": {"code": "x = 1"}}')
        + " then "
        + tc("{bad json}")
        + "\n"
        + tc('\n{"name": "lookup", "arguments": {"query": "capital of Peru", "k": 2}}\n')
    )
    prepared = prepare_calls(text, TOOLS)
    assert [c.name for c in prepared.calls] == ["python", "", "lookup"]
    assert [c.ok for c in prepared.calls] == [True, False, True]
    assert prepared.calls[0].args == CodeArgs(code="x = 1")
    assert prepared.calls[2].args == LookupArgs(query="capital of Peru", k=2)
    assert prepared.calls[1].arguments == "<tool_call>{bad json}</tool_call>"  # raw text kept
    assert prepared.errors[0].startswith("error: invalid JSON in tool call: ")


def test_accepted_variants():
    variants = [
        tc('```json\n{"name": "python", "arguments": {"code": "1"}}\n```'),  # fenced inside tags
        tc('{"name": "python", "arguments": "{\\"code\\": \\"1\\"}"}'),  # OpenAI string args
        tc('{"function": {"name": "python", "arguments": {"code": "1"}}}'),  # OpenAI shape
        tc('{"name": "python", "parameters": {"code": "1"}}'),  # "parameters" alias
        '<tool_call>\n{"name": "python", "arguments": {"code": "1"}}\n',  # unclosed at the end
    ]
    for text in variants:
        calls, errors = parse_tool_calls(text)
        assert errors == [], text
        assert [(c.name, c.arguments) for c in calls] == [("python", {"code": "1"})], text


def test_no_call_is_not_an_attempt():
    for text in ["The answer is 42.", "I would use <tool_call but did not", "</tool_call> stray"]:
        prepared = prepare_calls(text, TOOLS)
        assert not prepared.attempted and prepared.errors == []


def test_unclosed_call_before_another_call():
    text = '<tool_call>{"name": "python", "arguments": {"code": "1"}}\n' + tc(
        '{"name": "python", "arguments": {"code": "2"}}'
    )
    calls, errors = parse_tool_calls(text)
    assert [c.arguments["code"] for c in calls] == ["1", "2"] and errors == []


def test_python_fence_parser():
    text = "Let me compute.\n```python\nprint(17 * 23)\n```\nand\n```py\n\n```"
    prepared = prepare_calls(text, TOOLS, parser="python_fence")
    assert prepared.calls[0].args == CodeArgs(code="print(17 * 23)\n")
    assert prepared.errors == ["error: empty python code block"]


def test_parser_registry():
    @register_parser("test_upper")
    def parse_upper(text):
        return [
            ToolCall("python", {"code": line[5:]})
            for line in text.splitlines()
            if line.startswith("CALL ")
        ]

    try:
        assert "test_upper" in parser_names() and get_parser("test_upper") is parse_upper
        prepared = prepare_calls("hi\nCALL print(2)", TOOLS, parser="test_upper")
        assert prepared.valid[0].args == CodeArgs(code="print(2)")
    finally:
        from agentrl.tools import parsers

        parsers._PARSERS.pop("test_upper")
    with pytest.raises(UnknownNameError, match="did you mean 'hermes'"):
        get_parser("hermse")
