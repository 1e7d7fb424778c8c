"""The hf sampler computes on the learner's own tensors (sampler.share_learner_weights): one
copy of the weights. Synchronously: the same samples as with a copy. Asynchronously: the
learner's optimizer steps and the sampler's forward passes take turns (a weight gate)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import torch

from agentrl.config import load_config
from agentrl.errors import ConfigError, SamplerError
from agentrl.models import load_model
from agentrl.run.events import BatchTrained
from agentrl.run.orchestrator import Orchestrator
from agentrl.run.plotting import read_steps
from agentrl.run.settings import sampler_settings
from agentrl.samplers import SamplingParams
from agentrl.samplers.hf import HFSampler
from agentrl.weights.gate import ThreadGate
from tests.orchestrator.test_train import BASE, _run
from tests.samplers.test_hf import teacher_forced

pytestmark = pytest.mark.anyio

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=12, seed=3)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _ptrs(model: torch.nn.Module) -> set[int]:
    """Storages of the plain (not quantized) parameters."""
    return {p.untyped_storage().data_ptr() for p in model.parameters() if not hasattr(p, "qdata")}


async def test_the_sampler_follows_the_learners_tensors_and_never_writes_them():
    learner, tokenizer = load_model("tiny-llama", dtype="float32")
    model, _ = load_model("tiny-llama", dtype="float32")
    sampler = HFSampler(model, tokenizer, default_stop_token_ids=())
    prompt = list(tokenizer("hello")["input_ids"])
    try:
        live = {k: v.detach() for k, v in learner.state_dict().items()}
        saved = sampler.share_weights_from(live)
        assert saved >= 0.99 * sum(p.numel() * 4 for p in learner.parameters())
        assert _ptrs(model) == _ptrs(learner)
        # an optimizer step changes the learner's tensors in place; the publish copies nothing
        with torch.no_grad():
            for p in learner.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        await sampler.update_weights(live, version=1)
        gen = await sampler.generate(prompt, PARAMS)
        expected, _ = teacher_forced(learner, prompt, gen.token_ids, PARAMS.temperature)
        assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=1e-4)
        # other tensors (a checkpoint's) are taken over, not written into the learner's
        before = {k: v.clone() for k, v in learner.state_dict().items()}
        other, _ = load_model("tiny-llama", dtype="float32", seed=1)
        await sampler.update_weights(other.state_dict(), version=2)
        assert all(torch.equal(before[k], v) for k, v in learner.state_dict().items())
        assert _ptrs(model) == _ptrs(other)
    finally:
        await sampler.close()


class _ReadsSeen(ThreadGate):
    """The gate, telling when a forward pass has come to it."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived = threading.Event()

    @contextlib.contextmanager
    def reading(self) -> Iterator[int]:
        self.arrived.set()
        with super().reading() as version:
            yield version


async def test_with_a_gate_no_forward_pass_runs_while_the_learner_writes():
    learner, tokenizer = load_model("tiny-llama", dtype="float32")
    model, _ = load_model("tiny-llama", dtype="float32")
    sampler = HFSampler(model, tokenizer, default_stop_token_ids=())
    prompt = list(tokenizer("hello")["input_ids"])
    gate = _ReadsSeen()
    live = {k: v.detach() for k, v in learner.state_dict().items()}
    try:
        assert sampler.share_weights_from(live, gate) > 0
        await sampler.generate(prompt, PARAMS)
        steps = sampler.stats()["steps"]
        with gate.writing(version=1):  # the step's optimizer update, in progress
            with torch.no_grad():
                for p in learner.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
            gate.arrived.clear()
            waiting = asyncio.ensure_future(sampler.generate(prompt, PARAMS))
            assert await anyio.to_thread.run_sync(gate.arrived.wait, 30)
            # its pass is at the gate, which this write holds: no step has run
            assert not waiting.done() and sampler.stats()["steps"] == steps
        gen = await asyncio.wait_for(waiting, 30)
        assert gate.writes == 1 and sampler.stats()["weight_gate_wait_s"] > 0
        # tagged with the weights that produced it, before any publish says so
        assert set(gen.versions) == {1} and sampler.version == 0
        # the pass after the write computed with the new weights, without any publish
        expected, _ = teacher_forced(learner, prompt, gen.token_ids, PARAMS.temperature)
        assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=1e-4)
    finally:
        await sampler.close()


async def test_a_gate_needs_on_update_keep():
    learner, tokenizer = load_model("tiny-llama", dtype="float32")
    model, _ = load_model("tiny-llama", dtype="float32")
    sampler = HFSampler(model, tokenizer, on_update="reprefill")
    try:
        with pytest.raises(SamplerError, match="on_update=keep"):
            sampler.share_weights_from(learner.state_dict(), ThreadGate())
    finally:
        await sampler.close()


async def test_quantized_or_started_samplers_keep_their_own_copy():
    pytest.importorskip("torchao")
    learner, tokenizer = load_model("tiny-llama", dtype="float32")
    model, _ = load_model("tiny-llama", dtype="float32")
    sampler = HFSampler(model, tokenizer, weight_precision="int8")
    try:
        assert sampler.share_weights_from(learner.state_dict()) == 0
        assert not (_ptrs(model) & _ptrs(learner))
    finally:
        await sampler.close()


def test_a_sync_run_samples_and_learns_the_same_with_one_copy(tmp_path: Path):
    seeded = ["orchestrator.max_staleness=0", "sampler.seed=7", "orchestrator.seed=7"]
    seeded.append("orchestrator.max_steps=2")
    shared = _run(tmp_path / "shared", *seeded)
    copied = _run(tmp_path / "copied", *seeded, "sampler.share_learner_weights=false")
    learner = shared.learner.model
    assert _ptrs(shared.sampler.model) <= _ptrs(learner) | _buffers(shared.sampler.model)
    assert not (_ptrs(copied.sampler.model) & _ptrs(copied.learner.model))
    # the same training up to rounding (batch make-up moves log-probs by ~1e-7, which Adam
    # can turn into a flipped update here and there): the two runs differ far less than
    # either moved from the initial weights
    initial, _ = load_model("tiny-llama", dtype="float32")
    a = torch.cat([t.flatten() for t in learner.state_dict().values()])
    b = torch.cat([t.flatten() for t in copied.learner.model.state_dict().values()])
    start = torch.cat([t.flatten() for t in initial.state_dict().values()])
    moved = (a - start).abs().mean()
    assert moved > 0 and (a - b).abs().mean() < 0.05 * moved
    # and the copy, where there is one, holds what the learner published last
    pairs = zip(copied.sampler.model.parameters(), copied.learner.model.parameters(), strict=True)
    assert all(torch.equal(s, t) for s, t in pairs)


def _buffers(model: torch.nn.Module) -> set[int]:
    return {b.untyped_storage().data_ptr() for b in model.buffers()}


def test_an_async_run_samples_from_the_learners_tensors_between_its_steps(tmp_path: Path):
    """A learner in this process (learner_worker: thread): the sampler's parameters are the
    learner's, every optimizer step went through the gate, and it trained."""
    orch = _run(
        tmp_path,
        "orchestrator.max_staleness=1",
        "orchestrator.learner_worker=thread",
        "orchestrator.max_steps=3",
    )
    learner = orch.learner
    assert _ptrs(orch.sampler.model) <= _ptrs(learner.model) | _buffers(orch.sampler.model)
    gate = learner.weight_gate()
    # the version at the start, then one optimizer step a step, each saying its version
    assert gate.writes == 4 and learner.core.write_guard == gate.writing
    assert gate.version == learner.version == 3
    steps = read_steps(orch.run_dir)
    assert len(steps) == 3 and all("time/weight_gate_wait_s" in s for s in steps)
    # several optimizer updates a step: only the last says the step's version
    epochs = _run(
        tmp_path / "epochs",
        "orchestrator.max_staleness=1",
        "orchestrator.learner_worker=thread",
        "orchestrator.max_steps=2",
        "learner.ppo_epochs=2",
    )
    gate = epochs.learner.weight_gate()
    assert gate.writes == 1 + 2 * 2 and gate.version == epochs.learner.version == 2
    # and with the key off, a copy as before
    copied = _run(
        tmp_path / "copied",
        "orchestrator.max_staleness=1",
        "orchestrator.learner_worker=thread",
        "orchestrator.max_steps=1",
        "sampler.share_learner_weights=false",
    )
    assert not (_ptrs(copied.sampler.model) & _ptrs(copied.learner.model))


def test_sharing_in_an_async_run_needs_on_update_keep():
    base = [*BASE, "orchestrator.max_staleness=1"]
    assert sampler_settings(load_config(overrides=base)).share_learner_weights
    reprefill = [*base, "sampler.on_update=reprefill"]
    assert not sampler_settings(load_config(overrides=reprefill)).share_learner_weights
    explicit = [*reprefill, "sampler.share_learner_weights=true"]
    with pytest.raises(ConfigError, match=r"sampler\.on_update=keep"):
        sampler_settings(load_config(overrides=explicit))


@pytest.mark.slow  # a CLI-sized run with a learner process
@pytest.mark.parametrize("staleness, steps", [(0, 1), (1, 3)], ids=["sync", "async"])
def test_a_run_with_a_learner_process_samples_from_its_shared_buffers(
    tmp_path: Path, staleness: int, steps: int
):
    cfg = load_config(
        overrides=[
            *BASE,
            f"orchestrator.max_staleness={staleness}",
            "orchestrator.learner_worker=process",
            f"orchestrator.max_steps={steps}",
        ]
    )
    orch = Orchestrator(cfg, tmp_path / "run")
    orch.build()
    seen: list[bool] = []

    def on_event(e: object) -> None:
        if isinstance(e, BatchTrained):  # after the publish, the learner process still up
            views = orch.learner.state_dict_for_sampler().values()
            shared = {t.untyped_storage().data_ptr() for t in views}
            on_them = _ptrs(orch.sampler.model) <= shared | _buffers(orch.sampler.model)
            # asynchronously, through the gate the learner's optimizer steps take
            seen.append(on_them and (staleness == 0 or orch.learner.weight_gate() is not None))

    orch.events.subscribe(on_event)
    anyio.run(orch.run)
    assert seen == [True] * steps
