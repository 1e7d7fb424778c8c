"""Response parsing and option checks of the openai sampler (default suite, no server).

The end-to-end behaviour against a real `vllm serve` is in test_openai_sampler.py.
"""

from __future__ import annotations

import math

import pytest

from agentrl.errors import SamplerError
from agentrl.samplers.base import SamplingParams
from agentrl.samplers.openai_compat import OpenAISampler, _parse_choice

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=4)


def _response(**choice):
    base = {
        "text": " Paris.",
        "finish_reason": "length",
        "logprobs": {
            "tokens": ["token_id:7042", "token_id:30"],
            "token_logprobs": [-0.5, -0.25],
            "top_logprobs": [
                {"token_id:7042": -0.5, "token_id:1": -1.5},
                {"token_id:30": -0.25},
            ],
        },
    }
    base.update(choice)
    return {"id": "cmpl-1", "choices": [base]}


def test_token_ids_come_from_token_id_strings():
    gen = _parse_choice(_response(), PARAMS, version=3)
    assert gen.token_ids == [7042, 30]
    assert gen.logprobs == [-0.5, -0.25]
    assert gen.versions == [3, 3]
    assert gen.finish_reason == "length"
    assert gen.entropies is None


def test_token_ids_field_wins_and_entropy_is_a_lower_bound():
    gen = _parse_choice(
        _response(token_ids=[7042, 30]), PARAMS.with_(return_entropy=True), version=0
    )
    assert gen.token_ids == [7042, 30]
    p1, p2 = math.exp(-0.5), math.exp(-1.5)
    rest = 1 - p1 - p2
    expected = -(p1 * math.log(p1) + p2 * math.log(p2) + rest * math.log(rest))
    assert gen.entropies[0] == pytest.approx(expected)
    assert gen.entropies[1] >= 0


def test_text_tokens_without_ids_are_an_error_not_a_retokenisation():
    bad = _response()
    bad["choices"][0]["logprobs"]["tokens"] = [" Paris", "."]
    with pytest.raises(SamplerError, match="return_tokens_as_token_ids"):
        _parse_choice(bad, PARAMS, version=0)


def test_missing_logprobs_are_an_error():
    with pytest.raises(SamplerError, match="logprobs"):
        _parse_choice(_response(token_ids=[1, 2], logprobs=None), PARAMS, version=0)
    with pytest.raises(SamplerError, match="no choices"):
        _parse_choice({"choices": []}, PARAMS, version=0)


def test_options_are_checked():
    with pytest.raises(ValueError, match="base_url"):
        OpenAISampler("m")
    with pytest.raises(ValueError, match="max_retries"):
        OpenAISampler("m", base_url="http://127.0.0.1:1", max_retries=-1)
    s = OpenAISampler("m", base_url="http://127.0.0.1:8000/v1/")
    assert s.api_url == "http://127.0.0.1:8000/v1"
    assert s.server_url == "http://127.0.0.1:8000"
