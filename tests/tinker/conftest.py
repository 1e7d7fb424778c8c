"""Fixtures: the tiny random Llama as a model folder (weights + tokenizer) served by a local
Tinker server, and the official ``tinker`` SDK's ServiceClient pointed at it."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tinker", reason="the Tinker server tests need the [tinker] extra")


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-llama saved as a Hugging Face folder: the base model's name is this path, so the
    SDK's and the cookbook's AutoTokenizer.from_pretrained(name) load its tokenizer."""
    from agentrl.models import load_tokenizer, tiny_llama

    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama().save_pretrained(folder)
    load_tokenizer("tiny-llama").save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def server(tiny_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from agentrl.run.tinker import open_server

    srv = open_server(str(tiny_folder), tmp_path_factory.mktemp("tinker-state"))
    yield srv
    srv.close()


@pytest.fixture(scope="session")
def service(server: Any) -> Any:
    import tinker

    warnings.filterwarnings("ignore", category=FutureWarning, module="tinker")
    return tinker.ServiceClient(base_url=server.url, api_key="tml-local-test")
