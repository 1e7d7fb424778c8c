"""WeightLock: the cross-process lock over weights a learner process updates in place."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import torch

from agentrl.models import tiny_llama
from agentrl.weights.lock import WeightLock
from agentrl.weights.shared import SharedWeights, adopt


def test_the_version_is_recorded_by_a_writer_that_returns() -> None:
    owner = WeightLock.create(version=3)
    other = WeightLock.attach(owner.handle())
    try:
        assert other.version == 3
        with owner.writing(4):
            assert other.version == 3  # not before the weights are whole
        assert other.version == 4
        with pytest.raises(RuntimeError), owner.writing(5):
            raise RuntimeError("optimizer step failed")
        assert other.version == 4
    finally:
        owner.close()
        other.close()


def test_a_reader_and_a_writer_exclude_each_other() -> None:
    """Two open files of one lock (as in two processes): the writer waits for a reader's
    iteration to end, and a reader waits for the writer."""
    owner = WeightLock.create()
    other = WeightLock.attach(owner.handle())
    events: list[str] = []
    try:
        with other:
            writer = threading.Thread(target=lambda: _write(owner, events))
            writer.start()
            time.sleep(0.2)
            events.append("reader done")
        writer.join(5)
        assert events == ["reader done", "written"]
        assert other.version == 1
    finally:
        owner.close()
        other.close()


def _write(lock: WeightLock, events: list[str]) -> None:
    with lock.writing(1):
        events.append("written")


def test_a_reader_taking_the_lock_back_to_back_does_not_starve_the_writer() -> None:
    owner = WeightLock.create()
    other = WeightLock.attach(owner.handle())
    stop = threading.Event()

    def sample() -> None:  # the sampler: one iteration after another, no pause
        while not stop.is_set():
            with other:
                time.sleep(0.01)

    reader = threading.Thread(target=sample)
    reader.start()
    try:
        t0 = time.monotonic()
        for v in range(1, 6):
            with owner.writing(v):
                pass
        assert time.monotonic() - t0 < 2.0  # ~one iteration's wait per write
        assert other.version == 5
    finally:
        stop.set()
        reader.join(5)
        owner.close()
        other.close()


def test_a_killed_holder_releases_the_lock() -> None:
    owner = WeightLock.create()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from agentrl.weights.lock import WeightLock\n"
            f"lock = WeightLock.attach({owner.handle()!r})\n"
            "lock.__enter__()\n"
            "print('held', flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        done = threading.Event()

        def write() -> None:
            with owner.writing(1):
                done.set()

        threading.Thread(target=write, daemon=True).start()
        assert not done.wait(0.3)  # held over there
        holder.kill()
        assert done.wait(5)  # the kernel released it with the process
    finally:
        holder.kill()
        holder.wait()
        owner.close()


def test_adopt_moves_the_parameters_into_the_shared_buffers() -> None:
    """Tied weights included; the values stay, the Parameter objects stay (an optimizer
    keeps its state), and a change made through the optimizer is seen in the buffers."""
    model = tiny_llama(seed=0)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ids = {k: id(p) for k, p in model.named_parameters()}
    shared = SharedWeights(model.state_dict())
    try:
        assert adopt(model, shared)
        params = dict(model.named_parameters(remove_duplicate=False))
        for name, p in params.items():
            assert p.data_ptr() == shared.views[name].data_ptr(), name
            assert torch.equal(p.detach(), before[name]), name
        assert {k: id(p) for k, p in model.named_parameters()} == ids
        assert params["lm_head.weight"] is params["model.embed_tokens.weight"]
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
        opt.step()
        assert not torch.equal(shared.views["lm_head.weight"], before["lm_head.weight"])
        shared.refresh(model)  # nothing to copy: already there
    finally:
        shared.unlink()


def test_adopt_refuses_buffers_of_another_dtype() -> None:
    model = tiny_llama(seed=0)
    shared = SharedWeights(model.state_dict(), torch.bfloat16)
    try:
        assert not adopt(model, shared)
        p = next(model.parameters())
        assert all(p.data_ptr() != v.data_ptr() for v in shared.views.values())
    finally:
        shared.unlink()


def test_a_writer_that_died_waiting_does_not_stall_readers(monkeypatch) -> None:
    """The "writer waiting" flag of a writer killed before it took the lock is cleared by
    the next reader after WRITER_WAIT_S, not honoured at every iteration."""
    import agentrl.weights.lock as lock_module

    monkeypatch.setattr(lock_module, "WRITER_WAIT_S", 0.2)
    owner = WeightLock.create()
    other = WeightLock.attach(owner.handle())
    try:
        owner._slots[lock_module.WRITER_WAITING] = 1  # as left by a killed writer
        t0 = time.monotonic()
        with other:
            pass
        with other:
            pass
        assert time.monotonic() - t0 < 0.35  # waited once, then the flag was gone
        assert owner._slots[lock_module.WRITER_WAITING] == 0
    finally:
        owner.close()
        other.close()
