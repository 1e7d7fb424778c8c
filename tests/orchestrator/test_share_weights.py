"""learner.share_weights: the hf sampler computes on the learner's own weight tensors (no
copy, nothing copied on publish): in a synchronous run with the learner in this process
(generation waits while the learner's step changes them), and with a learner process whose
parameters live in shared memory, asynchronous too (generation waits while its optimizer
step changes them); everywhere else the sampler keeps its copy."""

from __future__ import annotations

import threading
import time

import anyio
import pytest
import torch

from agentrl.config import load_config
from agentrl.learner import Learner
from agentrl.models import load_model
from agentrl.orchestrator import Orchestrator
from agentrl.plotting import read_steps
from agentrl.runtime import sharing_blockers
from agentrl.samplers import SamplingParams
from agentrl.samplers.hf import HFSampler
from agentrl.weights.lock import WeightLock
from tests.orchestrator.test_train import BASE, _run


def _same_storage(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    pa = dict(a.named_parameters(remove_duplicate=False))
    pb = dict(b.named_parameters(remove_duplicate=False))
    return pa.keys() == pb.keys() and all(pa[k].data_ptr() == pb[k].data_ptr() for k in pa)


def test_synchronous_run_samples_with_the_learners_weights(tmp_path) -> None:
    """Two synchronous steps: the sampler's parameters are the learner's tensors, its
    tokens of step 2 are tagged version 1, and their behaviour log-probs are the learner's
    (the gap stays at float rounding), so the trained weights reached the sampler without a
    copy."""
    orch = _run(
        tmp_path, "orchestrator.max_steps=2", "orchestrator.max_staleness=0",
        "algorithm.off_policy=tis", "learner.bf16=off",
    )  # fmt: skip
    assert orch.parts.weight_guard is not None
    assert orch.sampler.shares_weights
    assert _same_storage(orch.sampler.model, orch.learner.model)
    steps = read_steps(tmp_path / "run")
    assert [s["version"] for s in steps] == [1.0, 2.0]
    assert all(0 <= s["logprob_gap/mean"] < 1e-3 for s in steps), steps
    assert orch.sampler.version == 2


def test_off_keeps_a_copy(tmp_path) -> None:
    orch = _run(
        tmp_path, "orchestrator.max_steps=1", "orchestrator.max_staleness=0",
        "learner.share_weights=off",
    )  # fmt: skip
    assert orch.parts.weight_guard is None and not orch.sampler.shares_weights
    learner = dict(orch.learner.model.named_parameters())
    sampler = dict(orch.sampler.model.named_parameters())
    assert all(learner[k].data_ptr() != sampler[k].data_ptr() for k in learner)
    # ... and the copy holds the published weights
    for k in learner:
        assert torch.equal(learner[k].detach(), sampler[k].detach()), k


class _LiveProcess:
    """Stands for a learner process whose parameters live in shared memory."""

    def live_weights(self) -> tuple[dict, object]:
        return {}, object()


class _ApartProcess:
    """... and for one that keeps them apart (CUDA, LoRA, another dtype)."""

    def live_weights(self) -> None:
        return None


def _thread_learner() -> Learner:
    return Learner.__new__(Learner)  # isinstance is all sharing_blockers asks of it


@pytest.mark.parametrize(
    ("overrides", "learner", "blocker"),
    [
        (["orchestrator.max_staleness=1"], _thread_learner, "orchestrator.max_staleness=1"),
        (["learner.share_weights=off"], _thread_learner, "learner.share_weights=off"),
        (["orchestrator.max_staleness=1"], _ApartProcess, "keeps its weights apart"),
        (
            ["orchestrator.max_staleness=1", "learner.ppo_epochs=2"],
            _LiveProcess,
            "2 optimizer updates per step",
        ),
    ],
)
def test_blockers(overrides: list[str], learner, blocker: str) -> None:
    cfg = load_config(overrides=[*BASE, *overrides])
    sampler = HFSampler.__new__(HFSampler)
    assert any(blocker in b for b in sharing_blockers(cfg, learner(), sampler))


def test_an_async_process_learner_with_one_update_has_no_blocker() -> None:
    cfg = load_config(overrides=[*BASE, "orchestrator.max_staleness=1"])
    assert sharing_blockers(cfg, _LiveProcess(), HFSampler.__new__(HFSampler)) == []
    # a synchronous one too (the lock is the process's, not the orchestrator's)
    cfg = load_config(overrides=[*BASE, "orchestrator.max_staleness=0", "learner.ppo_epochs=2"])
    assert sharing_blockers(cfg, _LiveProcess(), HFSampler.__new__(HFSampler)) == []


def test_async_run_samples_on_the_learner_process_weights(tmp_path) -> None:
    """max_staleness 1, the learner in its own process: its parameters live in shared
    memory and the sampler computes on the same pages (no copy of its own; the orchestrator
    holds no lock, the learner process takes its WeightLock around each optimizer step).
    (The tags and log-probs of tokens made on the live weights are checked against the
    learner's in tests/learner/test_worker.py.)"""
    orch = _run(
        tmp_path, "orchestrator.max_steps=3", "orchestrator.max_staleness=1",
        "orchestrator.learner_worker=process", "algorithm.off_policy=tis", "learner.bf16=off",
    )  # fmt: skip
    assert orch.parts.weight_guard is None
    assert orch.sampler.shares_weights
    lock = orch.sampler._guard
    assert isinstance(lock, WeightLock)
    # every parameter is a view of the one shared buffer of the learner process
    params = list(orch.sampler.model.parameters())
    assert len({p.untyped_storage().data_ptr() for p in params}) == 1
    assert lock.version == orch.learner.version == 3
    assert orch.sampler.version == 3
    steps = read_steps(tmp_path / "run")
    assert [s["version"] for s in steps] == [1.0, 2.0, 3.0]
    assert all(s["loss/total"] == s["loss/total"] for s in steps)  # finite, trained


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_a_bf16_sampler_computes_on_the_float32_masters(tmp_path, worker: str) -> None:
    """model.dtype bfloat16 (learner under bf16 autocast over float32 masters): the bf16
    sampler's parameters are those masters (its own bf16 copy is freed), synchronous with
    the learner in this process and asynchronous with it in its own process (its float32
    parameters are the shared buffers), and it computes as bf16 autocast over them: its
    behaviour log-probs stay within bf16 rounding of the learner's, and a synchronous run
    bypasses the start-of-step pass (sampler and learner compute in the same dtype)."""
    staleness = 0 if worker == "thread" else 1
    orch = _run(
        tmp_path, "orchestrator.max_steps=2", f"orchestrator.max_staleness={staleness}",
        f"orchestrator.learner_worker={worker}", "model.dtype=bfloat16", "learner.bf16=on",
        "algorithm.off_policy=tis",
    )  # fmt: skip
    assert orch.sampler.shares_weights
    assert orch.sampler.computes_in == "bfloat16 autocast over float32 weights"
    params = dict(orch.sampler.model.named_parameters())
    assert all(p.dtype == torch.float32 for p in params.values())
    if worker == "thread":
        assert _same_storage(orch.sampler.model, orch.learner.model)
    else:  # views of the learner process's one shared buffer
        assert len({p.untyped_storage().data_ptr() for p in params.values()}) == 1
    steps = read_steps(tmp_path / "run")
    assert [s["version"] for s in steps] == [1.0, 2.0]
    assert all(s["loss/total"] == s["loss/total"] for s in steps)  # finite, trained
    if worker == "thread":
        assert all(0 <= s["logprob_gap/mean"] < 0.02 for s in steps), steps
        assert all(s["learner/proximal_bypass"] == 1.0 for s in steps), steps


def test_a_half_type_the_sampler_cannot_widen_keeps_the_copy(tmp_path) -> None:
    """A float16 sampler cannot compute on float32 weights (only bf16 mirrors the learner's
    autocast): it keeps its copy."""
    model, tokenizer = load_model("tiny-llama", dtype="float16")
    sampler = HFSampler(model, tokenizer)
    owner = load_model("tiny-llama", dtype="float32")[0]
    with pytest.raises(ValueError, match="float16"):
        sampler.share_weights(
            dict(owner.named_parameters(remove_duplicate=False)), threading.Lock()
        )
    assert not sampler.shares_weights
    assert sampler.computes_in == "float16"


def test_generation_waits_while_the_weights_change() -> None:
    """The sampler holds the guard for each iteration: a request made while the owner of
    the weights holds it is served only after release, on the weights as they are then."""
    model, tokenizer = load_model("tiny-llama", dtype="float32")
    owner = load_model("tiny-llama", dtype="float32", seed=5)[0]
    sampler = HFSampler(model, tokenizer, default_stop_token_ids=())
    guard = threading.Lock()
    sampler.share_weights(owner.state_dict(), guard)
    assert _same_storage(sampler.model, owner)
    prompt = list(tokenizer("hello there")["input_ids"])
    params = SamplingParams(temperature=0.0, max_new_tokens=4)

    async def main() -> tuple[float, list[int]]:
        released_at = 0.0
        guard.acquire()

        async def release_later() -> None:
            nonlocal released_at
            await anyio.sleep(0.5)
            with torch.no_grad():  # the owner's "step": new weights, in place
                for p in owner.parameters():
                    p.mul_(0.5)
            released_at = time.perf_counter()
            guard.release()

        async with anyio.create_task_group() as tg:
            tg.start_soon(release_later)
            out = await sampler.generate(prompt, params)
        done = time.perf_counter()
        assert done >= released_at > 0
        await sampler.close()
        return done, out.token_ids

    _, tokens = anyio.run(main)
    # greedy tokens of the halved weights, as the owner computes them
    ids = torch.tensor([prompt])
    expected = []
    with torch.no_grad():
        for _ in range(4):
            nxt = int(owner(input_ids=ids).logits[0, -1].argmax())
            expected.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
    assert tokens == expected


def test_share_weights_refuses_mismatched_tensors() -> None:
    model, tokenizer = load_model("tiny-llama", dtype="float32")
    sampler = HFSampler(model, tokenizer)
    state = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="bfloat16"):
        sampler.share_weights(state, threading.Lock())
    assert not sampler.shares_weights


def test_on_where_it_cannot_is_a_config_error(tmp_path) -> None:
    from agentrl.errors import ConfigError

    cfg = load_config(
        overrides=[
            *BASE,
            "orchestrator.max_staleness=1",
            "orchestrator.learner_worker=thread",
            "learner.share_weights=on",
        ]
    )
    orch = Orchestrator(cfg, tmp_path / "run")
    with pytest.raises(ConfigError, match=r"share_weights=on.*max_staleness=1"):
        orch.build()
