"""decode_attention: the same attention as transformers' SDPA path for one-token steps."""

from __future__ import annotations

import copy

import pytest
import torch

from agentrl.models import cache_kwargs, load_model, returned_cache
from agentrl.samplers.decode_attention import NAME, use_decode_attention


@pytest.mark.parametrize("padded", [False, True])
def test_decode_steps_match_sdpa(padded: bool, monkeypatch) -> None:
    from transformers import AttentionInterface

    sdpa, _ = load_model("tiny-llama", dtype="float32", seed=0)
    ours = copy.deepcopy(sdpa)
    assert use_decode_attention(ours) and ours.config._attn_implementation == NAME
    assert sdpa.config._attn_implementation == "sdpa"
    query_lengths = []  # what transformers dispatched to our function
    registered = AttentionInterface._global_mapping[NAME]

    def spy(module, query, *args, **kwargs):
        query_lengths.append(query.shape[2])
        return registered(module, query, *args, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, NAME, spy)
    ids = torch.randint(3, 500, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    if padded:
        mask[0, :4] = 0  # a left-padded row
    logits = {}
    for name, model in (("sdpa", sdpa), ("ours", ours)):
        steps = []
        with torch.inference_mode():
            out = model(input_ids=ids, attention_mask=mask, use_cache=True)
            m = mask
            for _ in range(6):
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                m = torch.cat([m, torch.ones_like(nxt)], dim=1)
                cache = cache_kwargs(model, returned_cache(out))
                out = model(input_ids=nxt, attention_mask=m, use_cache=True, **cache)
                steps.append(out.logits[:, -1])
        logits[name] = torch.stack(steps)
    torch.testing.assert_close(logits["ours"], logits["sdpa"], atol=1e-5, rtol=1e-5)
    assert query_lengths.count(1) == 6 * ours.config.num_hidden_layers  # every decode step


def test_models_not_on_sdpa_are_left_alone() -> None:
    model, _ = load_model("tiny-llama", dtype="float32", seed=0)
    model.set_attn_implementation("eager")
    assert not use_decode_attention(model)
    assert model.config._attn_implementation == "eager"
