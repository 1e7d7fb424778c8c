"""On CUDA: the Tinker server's engine (``agentrl serve --tinker`` with ``learner.device:
cuda``) without the HTTP side (the GPU image has no fastapi or tinker SDK): two LoRA
clients on one base model, training lowers the loss, the idle client's adapter stays
bitwise, and a mixed batch of a snapshot and the base model samples with log-probs that
match the training forward's. Tiny model: correctness, not speed."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from agentrl.models import load_model
from agentrl.run.tinker.adapters import LoraSpec
from agentrl.run.tinker.decode import DecodeParams, Request
from agentrl.run.tinker.engine import Engine
from agentrl.run.tinker.wire import Datum, ForwardBackwardCall

TEXT = "The quick brown fox jumps over the lazy dog, and the dog sleeps on."


def engine_round(device: str, state_dir: Path) -> None:
    """The checks, on `device` (CPU too: the test is the same code off the GPU)."""
    model, tokenizer = load_model("tiny-llama", "float32", device=device)
    engine = Engine("tiny-llama", model, tokenizer, state_dir, device)
    engine.create_model("a", LoraSpec(rank=4, seed=1))
    engine.create_model("b", LoraSpec(rank=4, seed=2))
    assert all(
        p.device.type == torch.device(device).type for p in engine.models["a"].params.values()
    )
    ids = tokenizer.encode(TEXT)
    datum = Datum(ids[:-1], {"target_tokens": np.array(ids[1:], dtype=np.int64)})
    idle = engine.adapter_state("b")
    losses = []
    for step in range(6):
        call = ForwardBackwardCall("a", step, "cross_entropy", {}, False, [datum])
        _, metrics = engine.forward_backward(call)
        engine.optim_step("a", {"learning_rate": 1e-2})
        losses.append(metrics["loss:sum"])
    assert losses[-1] < 0.7 * losses[0], losses
    after = engine.adapter_state("b")
    assert all(torch.equal(idle[k], after[k]) for k in idle)
    fwd, _ = engine.forward_backward(
        ForwardBackwardCall("a", 99, "cross_entropy", {}, True, [datum])
    )
    trained = fwd[0]["logprobs"].tolist()
    path = engine.save_for_sampler("a", "gpu")
    params = DecodeParams(max_tokens=4, seed=3)
    jobs = [
        (path, Request(ids, 2, params, prompt_logprobs=True)),
        (None, Request(ids[:5], 1, params)),
    ]
    (seqs, prompt_lp), (base_seqs, _) = engine.sample_batch(jobs)
    assert [len(s.tokens) for s in seqs] == [4, 4] and len(base_seqs[0].tokens) == 4
    assert all(math.isfinite(x) for s in seqs for x in s.logprobs)
    assert max(abs(a - b) for a, b in zip(prompt_lp[1:], trained, strict=True)) < 1e-2


def test_the_tinker_engine_on_cuda(tmp_path):
    engine_round("cuda", tmp_path)
