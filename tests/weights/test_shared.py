"""SharedWeights: a state dict in shared-memory files another mapping sees without a copy."""

from __future__ import annotations

from pathlib import Path

import torch

from agentrl.models import tiny_llama
from agentrl.weights.shared import SharedWeights, drop_pages, layout, map_file, views


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


def _shmem_resident_mb() -> float:
    """This process's resident pages of shared memory (each mapping's, counted apart)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssShmem:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssShmem in /proc/self/status")


def test_a_reader_lets_the_pages_it_copied_go_and_still_sees_the_owners_writes():
    """What a sampler process does with a publish: copy the learner's shared buffers into
    its own weights, then drop them from its resident set (drop_pages); the bytes stay."""
    model = torch.nn.Linear(2048, 4096, bias=False)  # 32 MB of float32
    owner = SharedWeights(model)
    try:
        reader = {dt: map_file(path, dt, n) for dt, (path, n) in owner.files.items()}
        seen = views(reader, owner.slots)["weight"]
        own_copy = torch.empty_like(seen)
        before = _shmem_resident_mb()
        own_copy.copy_(seen)
        assert _shmem_resident_mb() - before > 24  # the reader's mapping is resident now
        assert drop_pages(seen)
        assert before - 4 < _shmem_resident_mb() < before + 4
        assert torch.equal(own_copy, model.weight)
        with torch.no_grad():
            model.weight.mul_(2.0)
        owner.refresh(model)
        assert torch.equal(seen, model.weight)  # mapped again on read, the owner's new values
    finally:
        owner.unlink()


def test_drop_pages_leaves_memory_it_did_not_map_alone():
    """Process memory (a tensor, a view of one, a mapping that is gone) is never touched:
    MADV_DONTNEED would zero private pages."""
    t = torch.arange(1 << 20, dtype=torch.float32)
    assert not drop_pages(t)
    assert not drop_pages(t[10:])
    assert torch.equal(t, torch.arange(1 << 20, dtype=torch.float32))
    assert not drop_pages(torch.empty(0))
