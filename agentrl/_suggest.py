"""Close-name suggestions for error messages."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def suggest(name: str, choices: Iterable[str], n: int = 3) -> str:
    """Return ``" (did you mean 'x'?)"`` or ``""`` when nothing is close."""
    close = difflib.get_close_matches(name, list(choices), n=n, cutoff=0.5)
    if not close:
        return ""
    if len(close) == 1:
        return f" (did you mean '{close[0]}'?)"
    return " (did you mean " + ", ".join(f"'{c}'" for c in close) + "?)"
