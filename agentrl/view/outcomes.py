"""What happened to each tool call and how each episode ended, read from the trace.

A call failed when the trace says so (``error``: a parse or validation error, a tool that
raised, a run that failed; ``timed_out``; ``infra_error``); a trace written before a failed
run was recorded as an error still shows it in the result text (a Python traceback, an
``error: ...`` line), so that counts too. An episode whose last turn hit the token limit
while writing its answer was cut short: truncated, whatever its status says.
"""

from __future__ import annotations

import re
from typing import Any

# the kinds of call outcome, in the order the pages list them
OUTCOMES = ("ok", "error", "timeout", "infra", "parse")
_TRACEBACK = "Traceback (most recent call last):"
_FRAME = re.compile(r'(?m)^  File "')  # a SyntaxError prints its frame without the header
_EXCEPTION = re.compile(r"(?m)^[A-Za-z_.]*(Error|Exception): ")


def _failed_text(result: str) -> bool:
    """A result that reads as a failed run: an ``error:`` first line, a Python traceback (a
    document that merely mentions ``ValueError: ...`` does not count)."""
    if result.startswith("error: ") or _TRACEBACK in result:
        return True
    return bool(_FRAME.search(result) and _EXCEPTION.search(result))


def call_outcome(call: dict[str, Any]) -> str:
    """``ok``, ``error`` (the tool or the code it ran failed), ``timeout``, ``infra`` (the
    platform failed) or ``parse`` (the call itself did not parse or validate)."""
    if call.get("infra_error"):
        return "infra"
    if call.get("timed_out"):
        return "timeout"
    error = call.get("error")
    if error:
        text = str(error)
        if not call.get("name") or (
            text.startswith("error: ") and not text.startswith("error: tool '")
        ):
            return "parse"  # invalid JSON, an unknown tool, arguments that do not validate
        return "error"
    if _failed_text(str(call.get("result") or "")[:4000]):
        return "error"  # a trace from before failed runs were recorded as errors
    return "ok"


def call_error_text(call: dict[str, Any]) -> str:
    """The one line a page shows for a failed call."""
    if call.get("error"):
        return str(call["error"])
    lines = [ln for ln in str(call.get("result") or "").splitlines() if ln.strip()]
    found = [ln for ln in lines if ln.startswith("error: ") or _EXCEPTION.match(ln)]
    return (found or lines or [""])[-1][:200]


def cut_at_limit(traj: dict[str, Any]) -> bool:
    """The episode ended while its last turn was still writing, at the token limit (its
    answer is cut), though its status may say ok."""
    if traj.get("status") != "ok":
        return False
    turns = traj.get("turns") or []
    if not turns:
        return False
    last = turns[-1]
    ran = [c for c in last.get("tool_calls") or [] if c.get("name")]
    return last.get("finish_reason") == "length" and not ran


def quantiles(values: list[float]) -> list[float] | None:
    """min, 25th percentile, median, 75th percentile, max (linear interpolation)."""
    if not values:
        return None
    xs = sorted(values)

    def q(p: float) -> float:
        pos = p * (len(xs) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return [xs[0], q(0.25), q(0.5), q(0.75), xs[-1]]
