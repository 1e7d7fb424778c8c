"""A user's algorithm plug-in living in an importable module (see test_worker.py)."""

from __future__ import annotations

from typing import Any

from agentrl.algos import ADVANTAGES, register_advantage


@register_advantage("halved_grpo", override=True)
def halved_grpo(*args: Any, **kwargs: Any) -> Any:
    """GRPO's advantages at half scale."""
    return ADVANTAGES.get("grpo")(*args, **kwargs) * 0.5
