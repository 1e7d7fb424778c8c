"""The learner in its own process: same results as in-process, errors come back, no leaks."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pytest
import torch

from agentrl.learner import Learner
from agentrl.run.placement.learner_process import LearnerError, LearnerProcess
from agentrl.run.settings import resolve
from agentrl.types import TrajectoryGroup
from tests.learner.conftest import make_cfg
from tests.procs import alive
from tests.waiting import wait_until

CFG = {
    "model": {"name": "tiny-llama", "seed": 0},
    "orchestrator": {"cpu_threads": 1},
    "learner": {"fused_logprobs": "off"},
}


@pytest.fixture
def worker() -> Iterator[LearnerProcess]:
    with closing(LearnerProcess(make_cfg(**CFG))) as proc:
        yield proc


@pytest.fixture(scope="module")
def serving() -> Iterator[LearnerProcess]:
    """One child for the tests that only need it alive and serving (a start is ~9 s)."""
    with closing(LearnerProcess(make_cfg(**CFG))) as proc:
        yield proc


def _shm_files() -> set[str]:
    shm = Path("/dev/shm")
    return {p.name for p in shm.glob("agentrl-learner-*")} if shm.is_dir() else set()


def test_steps_match_the_in_process_learner(
    worker: LearnerProcess,
    fresh_model: Callable[[], torch.nn.Module],
    groups: list[TrajectoryGroup],
) -> None:
    local = Learner(fresh_model(), None, resolve(make_cfg(**CFG)).learner)
    initial = worker.state_dict_for_sampler()
    for k, v in local.model.state_dict().items():
        assert torch.equal(initial[k], v), k  # the child built the same seeded model
    for _ in range(2):
        theirs = worker.step(groups)
        mine = local.step(groups)
        assert theirs["version"] == mine["version"]
        assert theirs["loss/total"] == pytest.approx(mine["loss/total"], rel=1e-5, abs=1e-7)
    assert worker.version == local.version == 2 and worker.step_count == 2
    published = worker.state_dict_for_sampler()
    for k, v in local.model.state_dict().items():
        torch.testing.assert_close(published[k], v, rtol=1e-5, atol=1e-6)
    # tied embeddings share one shared-memory slot, as they share one parameter
    assert (
        published["lm_head.weight"].data_ptr() == published["model.embed_tokens.weight"].data_ptr()
    )
    cast = worker.state_dict_for_sampler(dtype=torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in cast.values())


def test_checkpoint_round_trip(
    serving: LearnerProcess, groups: list[TrajectoryGroup], tmp_path: Path
) -> None:
    serving.step(groups)
    at = serving.version
    saved = serving.save_checkpoint(tmp_path / "ckpt")
    assert (saved / "model.safetensors").is_file()
    after_one = {k: v.clone() for k, v in serving.state_dict_for_sampler().items()}
    serving.step(groups)
    assert serving.version == at + 1
    serving.load_checkpoint(saved)
    assert serving.version == at
    for k, v in serving.state_dict_for_sampler().items():
        assert torch.equal(v, after_one[k]), k  # the shared views were refreshed


def test_errors_in_a_request_are_raised_here_and_the_worker_goes_on(
    serving: LearnerProcess, groups: list[TrajectoryGroup]
) -> None:
    at = serving.version
    with pytest.raises(ValueError, match="at least one TrajectoryGroup") as info:
        serving.step([])
    assert any("learner process" in note for note in info.value.__notes__)
    assert serving.step(groups)["version"] == at + 1  # still serving


@pytest.mark.slow  # a learner child process of its own (process faults)
def test_a_dead_worker_is_reported_not_waited_on(
    worker: LearnerProcess, groups: list[TrajectoryGroup]
) -> None:
    worker.wait_ready()
    os.kill(worker._proc.pid, signal.SIGKILL)
    with pytest.raises(LearnerError, match=r"died while training a step.*signal 9"):
        worker.step(groups)


def test_start_failure_names_the_cause() -> None:
    cfg = make_cfg(**{**CFG, "model": {"name": "no-such-model"}})
    failed = pytest.raises(LearnerError, match=r"failed to start.*unknown model 'no-such-model'")
    with closing(LearnerProcess(cfg)) as proc, failed:
        proc.wait_ready(timeout=120)
    assert proc._proc.poll() is not None


@pytest.mark.slow  # a learner child process of its own (process faults)
def test_close_ends_the_child_and_leaves_no_shared_memory(groups) -> None:
    before = _shm_files()
    proc = LearnerProcess(make_cfg(**CFG))
    proc.step(groups)
    assert _shm_files() == before  # unlinked as soon as both sides mapped them
    proc.close()
    proc.close()  # idempotent
    assert proc._proc.returncode == 0
    with pytest.raises(LearnerError, match="closed"):
        proc.step(groups)


def test_the_child_ignores_ctrl_c(serving: LearnerProcess, groups) -> None:
    # Ctrl-C reaches the whole process group; the orchestrator decides when the child stops
    serving.wait_ready()
    at = serving.version
    os.kill(serving._proc.pid, signal.SIGINT)
    assert serving.step(groups)["version"] == at + 1


def test_algorithms_registered_by_an_importable_module_are_seen_in_the_child(groups) -> None:
    import tests.learner.custom_advantage  # noqa: F401  (registers "halved_grpo")

    cfg = make_cfg(**{**CFG, "algorithm": {"advantage": "halved_grpo"}})
    with closing(LearnerProcess(cfg)) as proc:
        assert proc.step(groups)["version"] == 1


def test_algorithms_registered_in_main_fail_with_the_fix() -> None:
    from agentrl.algos import register_advantage

    def only_here(*args, **kwargs):  # pragma: no cover - never called
        raise AssertionError

    only_here.__module__ = "__main__"  # as if defined in a training script
    register_advantage("only_in_main")(only_here)
    cfg = make_cfg(**{**CFG, "algorithm": {"advantage": "only_in_main"}})
    failed = pytest.raises(LearnerError, match=r"(?s)only_in_main.*learner_worker=thread")
    with closing(LearnerProcess(cfg)) as proc, failed:
        proc.wait_ready(timeout=120)


@pytest.mark.slow  # a learner child process of its own (process faults)
def test_the_child_outlives_the_thread_that_started_it(groups) -> None:
    # `agentrl train` builds in a worker thread that anyio retires when idle; the child must
    # live as long as the parent process, not as long as that thread
    import threading

    box: list[LearnerProcess] = []
    starter = threading.Thread(target=lambda: box.append(LearnerProcess(make_cfg(**CFG))))
    starter.start()
    starter.join()
    proc = box[0]
    try:
        proc.wait_ready()
        assert proc.step(groups)["version"] == 1
    finally:
        proc.close()


@pytest.mark.slow  # a learner child process of its own (process faults)
def test_the_child_exits_when_its_parent_dies(tmp_path) -> None:
    import subprocess
    import sys

    script = tmp_path / "parent.py"
    script.write_text(
        "import sys\n"
        "from tests.learner.test_worker import CFG\n"
        "from tests.learner.conftest import make_cfg\n"
        "from agentrl.run.placement.learner_process import LearnerProcess\n"
        "p = LearnerProcess(make_cfg(**CFG))\n"
        "p.wait_ready()\n"
        "print(p._proc.pid, flush=True)\n"
        "sys.stdin.read()\n"
    )
    repo = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=repo,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    try:
        child = int(parent.stdout.readline())
    finally:
        parent.kill()
        parent.wait()
    wait_until(lambda: not alive(child), "the orphaned learner child to exit")


def test_a_bf16_run_shares_the_float32_masters_themselves(
    fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> None:
    """model.dtype bfloat16 on CPU: the child's float32 parameters are the shared buffers
    (no bf16 copy of them; a bf16 hf sampler casts at a publish), equal to a local learner's
    after the same step, tied entries in one slot."""
    cfg = make_cfg(**{**CFG, "model": {**CFG["model"], "dtype": "bfloat16"}})
    local = Learner(fresh_model(), None, resolve(make_cfg(**CFG)).learner)
    with closing(LearnerProcess(cfg)) as proc:
        proc.step(groups)
        local.step(groups)
        published = proc.state_dict_for_sampler()
        for k, v in local.model.state_dict().items():
            assert published[k].dtype == torch.float32, k
            torch.testing.assert_close(published[k], v, rtol=1e-4, atol=1e-5)
        ptr = published["lm_head.weight"].data_ptr()
        assert ptr == published["model.embed_tokens.weight"].data_ptr()


def test_shared_weights_are_a_half_type_copy_only_where_they_cannot_be_the_parameters() -> None:
    """The buffers are kept in the hf sampler's half type only where they are a copy anyway
    (CUDA IPC, LoRA's merged policy); in shared memory they are the float32 parameters."""
    from agentrl.run.placement.learner_process import shared_dtype

    bf16 = make_cfg(**{**CFG, "model": {**CFG["model"], "dtype": "bfloat16"}})
    assert shared_dtype(bf16, "shared_memory") is None
    assert shared_dtype(bf16, "cuda_ipc") == torch.bfloat16
    lora = make_cfg(**{**CFG, "model": {**CFG["model"], "dtype": "bfloat16", "lora": {"r": 4}}})
    assert shared_dtype(lora, "shared_memory") == torch.bfloat16
    assert shared_dtype(make_cfg(**CFG), "cuda_ipc") is None  # float32: nothing to cast


def test_the_child_runs_on_the_configured_allocator(serving: LearnerProcess) -> None:
    """orchestrator.cpu_allocator: auto preloads tcmalloc into the learner process where it
    is installed (agentrl.cpu.allocator_env); the parent's own LD_PRELOAD is not changed."""
    from agentrl.cpu import tcmalloc_library

    pid = serving._ranks[0].proc.pid
    mapped = "libtcmalloc" in Path(f"/proc/{pid}/maps").read_text()
    assert mapped == (tcmalloc_library() is not None)
    assert "libtcmalloc" not in os.environ.get("LD_PRELOAD", "")
