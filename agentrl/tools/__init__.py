"""Tools an agent can call (installed as agentrl.tools).

The contract is in :mod:`agentrl.tools.base`; parsing, validation and concurrent execution
of a turn's calls in :mod:`agentrl.tools.calls`; built-in tools in :mod:`agentrl.tools.python`
and :mod:`agentrl.tools.search` (imported lazily: ``from agentrl.tools import PythonTool``).
"""

from __future__ import annotations

from typing import Any

from agentrl.tools.base import Tool, ToolCall, ToolContext, ToolOutput
from agentrl.tools.calls import (
    PreparedCall,
    PreparedCalls,
    ToolResult,
    prepare_calls,
    run_tool_calls,
    summarize,
    validate_arguments,
)
from agentrl.tools.parsers import (
    MalformedCall,
    get_parser,
    parse_tool_calls,
    parser_names,
    register_parser,
)

_LAZY = {
    "PythonTool": "agentrl.tools.python",
    "SearchTool": "agentrl.tools.search",
    "SearchHit": "agentrl.tools.search",
    "LocalSearchIndex": "agentrl.tools.search",
    "HttpSearchBackend": "agentrl.tools.search",
    "SearchServer": "agentrl.tools.search_server",
}

__all__ = [
    "HttpSearchBackend",
    "LocalSearchIndex",
    "MalformedCall",
    "PreparedCall",
    "PreparedCalls",
    "PythonTool",
    "SearchHit",
    "SearchServer",
    "SearchTool",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolOutput",
    "ToolResult",
    "get_parser",
    "parse_tool_calls",
    "parser_names",
    "prepare_calls",
    "register_parser",
    "run_tool_calls",
    "summarize",
    "validate_arguments",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentrl.tools' has no attribute {name!r}")
