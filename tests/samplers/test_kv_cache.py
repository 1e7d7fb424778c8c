"""GrowingCache: the same keys, values and logits as transformers' DynamicCache, with appends
written in place and a fresh buffer only when the spare positions run out or the keys were
replaced from outside (the hf sampler drops and merges rows that way)."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from agentrl.models import cache_kwargs, load_model, returned_cache
from agentrl.samplers import kv_cache
from agentrl.samplers.hf import HFSampler
from agentrl.samplers.kv_cache import GrowingCache, GrowingLayer


def _decode(model, cache, ids, steps):
    logits = []
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True, **cache_kwargs(model, cache))
        for _ in range(steps):
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            logits.append(out.logits[:, -1].float())
            out = model(input_ids=nxt, use_cache=True, **cache_kwargs(model, returned_cache(out)))
    return torch.stack(logits), returned_cache(out)


def test_same_logits_and_keys_as_dynamic_cache(monkeypatch) -> None:
    monkeypatch.setattr(kv_cache, "HEADROOM", 3)  # several regrowths within the run
    model, _ = load_model("tiny-llama", dtype="float32", seed=0)
    ids = torch.randint(3, 500, (3, 9), generator=torch.Generator().manual_seed(0))
    ref_logits, ref = _decode(model, DynamicCache(), ids, steps=8)
    got_logits, got = _decode(model, GrowingCache(), ids, steps=8)
    torch.testing.assert_close(got_logits, ref_logits)
    assert len(got.layers) == len(ref.layers)
    for g, r in zip(got.layers, ref.layers, strict=True):
        assert isinstance(g, GrowingLayer)
        torch.testing.assert_close(g.keys, r.keys)
        torch.testing.assert_close(g.values, r.values)
    assert got.get_seq_length() == ref.get_seq_length() == 9 + 8


def test_appends_write_in_place_until_the_headroom_is_used() -> None:
    layer = GrowingLayer()
    k = torch.randn(2, 1, 5, 4)
    layer.update(k, k + 1)
    buffer = layer._kbuf
    assert buffer is not None and buffer.shape[-2] == 5 + kv_cache.HEADROOM
    steps = [torch.randn(2, 1, 1, 4) for _ in range(kv_cache.HEADROOM)]
    for s in steps:
        keys, values = layer.update(s, s + 1)
        assert layer._kbuf is buffer  # no copy of the cache
    torch.testing.assert_close(keys, torch.cat([k, *steps], dim=-2))
    torch.testing.assert_close(values, torch.cat([k, *steps], dim=-2) + 1)
    layer.update(steps[0], steps[0])  # one past the headroom: a bigger buffer, contents kept
    assert layer._kbuf is not buffer and layer.keys.shape[-2] == 5 + kv_cache.HEADROOM + 1
    torch.testing.assert_close(layer.keys[:, :, :5], k)


def test_keys_replaced_from_outside_are_copied_into_a_fresh_buffer() -> None:
    layer = GrowingLayer()
    k = torch.arange(3 * 2 * 4 * 2, dtype=torch.float32).view(3, 2, 4, 2)
    layer.update(k, -k)
    # what the hf sampler does when rows finish: keep rows 0 and 2, trim a padding column
    layer.keys = layer.keys.index_select(0, torch.tensor([0, 2]))[..., 1:, :]
    layer.values = layer.values.index_select(0, torch.tensor([0, 2]))[..., 1:, :]
    new = torch.full((2, 2, 1, 2), 7.0)
    keys, values = layer.update(new, -new)
    torch.testing.assert_close(keys, torch.cat([k[[0, 2], :, 1:], new], dim=-2))
    torch.testing.assert_close(values, torch.cat([-k[[0, 2], :, 1:], -new], dim=-2))
    assert keys.data_ptr() == layer._kbuf.data_ptr()


def _storage_bytes(cache) -> int:
    """Bytes of the distinct storages a cache's layers hold (views and buffers)."""
    seen: dict[int, int] = {}
    for layer in cache.layers:
        for t in (layer.keys, layer.values, layer._kbuf, layer._vbuf):
            if t is not None:
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def test_a_batch_holds_one_copy_of_its_rows_after_rows_merge_or_finish() -> None:
    """Merging a prefill's rows in, or dropping finished ones, replaces each layer's keys:
    the former buffer goes with them (it used to stay until the next append, two copies of
    the cache at once), and the next append still sees every row's keys."""
    from agentrl.samplers.batch_kv import EagerBatch

    batch = EagerBatch(torch.device("cpu"))
    first, second = GrowingCache(), GrowingCache()
    k = torch.randn(3, 2, 6, 4)
    for layer_index in range(2):
        first.update(k, -k, layer_index)
        second.update(k[:1, :, :4], -k[:1, :, :4], layer_index)
    batch.merge(first, 6)
    batch.merge(second, 4)  # 4 rows, the new one left-padded by 2
    rows = 4 * 2 * 6 * 4 * 4  # rows x heads x positions x head_dim x float32
    assert _storage_bytes(batch.cache) == 2 * 2 * rows  # keys and values of 2 layers
    batch.keep(torch.tensor([0, 3]), 0)
    assert _storage_bytes(batch.cache) == 2 * 2 * rows // 2
    new = torch.randn(2, 2, 1, 4)
    keys, _ = batch.cache.layers[0].update(new, -new)
    torch.testing.assert_close(keys[0, :, :6], k[0])
    torch.testing.assert_close(keys[1, :, 2:6], k[0, :, :4])
    torch.testing.assert_close(keys[:, :, 6:], new)


def test_an_unknown_kv_cache_option_names_the_choices() -> None:
    model, tok = load_model("tiny-llama", dtype="float32", seed=0)
    with pytest.raises(ValueError, match="kv_cache must be one of growing, dynamic, static"):
        HFSampler(model, tok, kv_cache="paged")
