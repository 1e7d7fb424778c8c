"""Fixtures of the harness tests: the tiny model (its tokenizer is the scripted policy's)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def tiny() -> tuple[Any, Any]:
    from agentrl.models import load_model

    return load_model("tiny-llama", dtype="float32")
