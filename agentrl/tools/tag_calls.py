"""The ``search_tag`` call format: ``<search>query</search>``, as ARPO's and Search-R1's code
write a search (results come back in ``<result>`` blocks, rendered by the environment).

    <search>capital of Peru</search>   -> ToolCall("search", {"query": "capital of Peru"})
    <search></search>                  -> MalformedCall: an empty query
    <search>capital of Peru            -> MalformedCall: the tag is not closed
    capital of Peru</search>           -> MalformedCall: the tag is not opened

Tags are matched case-insensitively; several searches in one turn are several calls.
Every malformed call's observation shows the expected shape.
"""

from __future__ import annotations

import re

from agentrl.tools.base import ToolCall
from agentrl.tools.parsers import MalformedCall, ParsedCall, register_parser

SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
EXPECTED = "write one search as <search>your query</search>, e.g. <search>capital of Peru</search>"
_TAG = re.compile(r"<search>(.*?)(</search>|(?=<search>)|$)", re.DOTALL | re.IGNORECASE)


@register_parser("search_tag")
def parse_search_tags(text: str) -> list[ParsedCall]:
    out: list[ParsedCall] = []
    for m in _TAG.finditer(text):
        query, closed = m.group(1).strip(), bool(m.group(2))
        if not closed:
            out.append(
                MalformedCall(m.group(0), f"error: the search tag is not closed; {EXPECTED}")
            )
        elif not query:
            out.append(MalformedCall(m.group(0), f"error: the search query is empty; {EXPECTED}"))
        else:
            out.append(ToolCall(name="search", arguments={"query": query}, raw=m.group(0)))
    if not out and SEARCH_CLOSE in text.lower():  # "capital of Peru</search>"
        out.append(MalformedCall(text, f"error: the search tag is not opened; {EXPECTED}"))
    return out
