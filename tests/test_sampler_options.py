"""Sampler settings a backend cannot use are refused, not dropped (the openai backend's own
are in tests/test_runtime.py; engine options in tests/samplers/test_vllm_options.py)."""

from __future__ import annotations

import pytest

from agentrl.errors import ConfigError
from agentrl.run.settings import resolve
from agentrl.samplers import sampler_options
from tests.test_runtime import _cfg


@pytest.mark.parametrize("backend", ["hf", "vllm"])
@pytest.mark.parametrize("key", ["base_url", "api_key"])
def test_server_settings_need_the_openai_backend(backend, key):
    with pytest.raises(ConfigError, match=f"sampler.{key} is for sampler.backend=openai"):
        sampler_options(
            resolve(_cfg(f"sampler.backend={backend}", f"sampler.{key}=http://x")).sampler
        )
