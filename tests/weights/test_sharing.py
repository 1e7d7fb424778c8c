"""How the learner process shares its weights: the choice (CUDA IPC exactly when the learner
is on CUDA), and the shared-memory fallback (a CPU learner process uses it in
tests/learner/test_worker.py)."""

from __future__ import annotations

import pytest
import torch

from agentrl.config import config_from_dict
from agentrl.devices import sharing_kind
from agentrl.errors import ConfigError
from agentrl.models import tiny_llama
from agentrl.run.settings import resolve
from agentrl.weights.shared import SharedWeights, attach, share_weights


def test_auto_picks_cuda_ipc_exactly_for_a_cuda_learner():
    assert sharing_kind("auto", torch.device("cuda", 0)) == "cuda_ipc"
    assert sharing_kind("auto", torch.device("cuda", 1)) == "cuda_ipc"
    assert sharing_kind("auto", torch.device("cpu")) == "shared_memory"
    assert sharing_kind("shared_memory", torch.device("cuda", 0)) == "shared_memory"  # via host


def test_cuda_ipc_for_a_cpu_learner_names_the_key_and_the_fix():
    with pytest.raises(ConfigError, match=r"learner\.weight_sharing=cuda_ipc.*cpu.*=auto"):
        sharing_kind("cuda_ipc", torch.device("cpu"))
    cfg = config_from_dict({"learner": {"device": "cpu", "weight_sharing": "cuda_ipc"}})
    with pytest.raises(ConfigError, match="weight_sharing"):
        resolve(cfg)  # at assembly, before a learner process starts


def test_the_shared_memory_fallback_round_trips_a_state_dict():
    model = tiny_llama(0)
    shared = share_weights(model.state_dict(), sharing_kind("auto", torch.device("cpu")))
    assert isinstance(shared, SharedWeights)
    seen = attach(shared.handle())
    for name, t in model.state_dict().items():
        assert torch.equal(seen[name], t), name
    with torch.no_grad():
        model.model.embed_tokens.weight.add_(1.0)
    shared.refresh(model.state_dict())
    assert torch.equal(seen["model.embed_tokens.weight"], model.model.embed_tokens.weight)


def test_shared_memory_too_small_for_the_weights_is_refused_before_any_write(monkeypatch):
    import os

    from agentrl.errors import WeightUpdateError

    real = os.statvfs

    class Tiny:  # a 64 MB /dev/shm, as containers often have
        def __init__(self, st):
            self.f_frsize = st.f_frsize
            self.f_bavail = (64 << 20) // st.f_frsize

    monkeypatch.setattr(os, "statvfs", lambda p: Tiny(real(p)))
    with pytest.raises(WeightUpdateError, match=r"needs \d+ MB .* has 64 MB free.*shm-size"):
        share_weights({"w": torch.zeros(20 << 20)}, "shared_memory")  # 80 MB of float32
    share_weights({"w": torch.zeros(1 << 20)}, "shared_memory").unlink()  # 4 MB fits
