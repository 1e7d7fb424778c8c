"""SharedWeights: a state dict in shared-memory files another mapping sees without a copy."""

from __future__ import annotations

from pathlib import Path

import torch

from agentrl.models import tiny_llama
from agentrl.weights.shared import SharedWeights, layout, map_file, views


def test_tied_entries_share_one_slot():
    state = tiny_llama().state_dict()
    sizes, slots = layout(state)
    assert slots["lm_head.weight"] == slots["model.embed_tokens.weight"]
    unique = {t.data_ptr(): t.numel() for t in state.values()}
    assert sizes == {torch.float32: sum(unique.values())}


def test_a_second_mapping_sees_every_refresh():
    model = tiny_llama(seed=0)
    shared = SharedWeights(model)
    try:
        buffers = {dt: map_file(path, dt, n) for dt, (path, n) in shared.files.items()}
        seen = views(buffers, shared.slots)
        for name, t in model.state_dict().items():
            assert torch.equal(seen[name], t)
        with torch.no_grad():
            model.model.norm.weight.add_(1.0)
        shared.refresh(model)
        assert torch.equal(seen["model.norm.weight"], model.model.norm.weight)
    finally:
        shared.unlink()
    assert not any(Path(path).exists() for path, _ in shared.files.values())
