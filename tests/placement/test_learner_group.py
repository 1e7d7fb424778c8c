"""The learner group launched by the run layer: ``learner.world_size: 2`` in local
processes (gloo), FSDP2. Weights published once (gathered on rank 0), sharded checkpoints
resumed by the group and by a single learner (another world size), a dead rank named."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest
import torch

from agentrl.errors import ConfigError
from agentrl.learner import Learner
from agentrl.models import tiny_llama
from agentrl.run.placement.learner_process import (
    FAULT_ENV,
    Fault,
    LearnerError,
    LearnerProcess,
    RankPhase,
)
from agentrl.run.plotting import read_steps
from agentrl.run.settings import learner_worker, resolve
from tests.learner.conftest import make_cfg, make_groups, one_torch_thread

GROUP = {
    "model": {"name": "tiny-llama", "seed": 0},
    "orchestrator": {"cpu_threads": 1},
    "learner": {"fused_logprobs": "off", "world_size": 2, "parallel": "fsdp"},
}
ONE = {**GROUP, "learner": {"fused_logprobs": "off"}}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - v).abs().max()) for k, v in b.items())


# 2 rank processes load the model: about a minute on 2 shared cores (the default suite has
# the 2-rank equality test, tests/learner/test_distributed.py)
@pytest.mark.integration
def test_two_fsdp_ranks_train_publish_checkpoint_and_fail_by_name(tmp_path: Path) -> None:
    with one_torch_thread():
        groups = make_groups(tiny_llama(seed=0), n_groups=3, seed=1)
        single = Learner(tiny_llama(seed=0), None, resolve(make_cfg(**ONE)).learner)
    with closing(LearnerProcess(make_cfg(**GROUP))) as group:
        for _ in range(2):
            theirs = group.step(groups)
            with one_torch_thread():
                mine = single.step(groups)
            assert theirs["loss/total"] == pytest.approx(mine["loss/total"], rel=1e-4, abs=1e-6)
        assert group.version == 2
        # the samplers' weights: whole, from rank 0's shared buffers
        published = group.state_dict_for_sampler()
        assert max_diff(published, single.model.state_dict()) < 1e-4

        saved = group.save_checkpoint(tmp_path / "ckpt")
        assert (saved / "sharded").is_dir()  # every rank's shards (DCP)
        assert (saved / "model.safetensors").is_file()  # the whole policy for export
        group.step(groups)
        group.load_checkpoint(saved)
        assert group.version == 2
        assert max_diff(group.state_dict_for_sampler(), single.model.state_dict()) < 1e-4

        # another world size: one process resumes the sharded checkpoint, AdamW included
        with one_torch_thread():
            resumed = Learner(tiny_llama(seed=1), None, resolve(make_cfg(**ONE)).learner)
            resumed.load_checkpoint(saved)
            assert resumed.version == 2
            assert max_diff(resumed.model.state_dict(), single.model.state_dict()) < 1e-4
            nxt, ref = resumed.step(groups), single.step(groups)
        assert nxt["loss/total"] == pytest.approx(ref["loss/total"], rel=1e-3, abs=1e-5)

        # a rank that dies: the step fails at once with an error naming it, nothing hangs
        os.kill(group.pids[1], signal.SIGKILL)
        with pytest.raises(LearnerError, match=r"learner rank 1 died while training a step"):
            group.step(groups)
    assert all(_gone(pid) for pid in group.pids or [])


class _InThread:
    """`call()` in a thread (a blocking step the test acts on meanwhile); its outcome."""

    def __init__(self, call: Callable[[], object]) -> None:
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call: Callable[[], object]) -> None:
        try:
            call()
        except BaseException as e:  # the test reads it
            self.error = e

    def outcome(self) -> BaseException | None:
        self.thread.join(timeout=300)  # bounds a hang (the failure this test is about)
        assert not self.thread.is_alive(), "the step hung"
        return self.error


# each spawns 2 rank processes: integration (about a minute each on 2 shared cores)
@pytest.mark.integration
def test_a_rank_killed_mid_step_is_named_and_the_checkpoint_resumes(tmp_path: Path) -> None:
    """Rank 1 killed inside step 2's backward (FSDP2: rank 0 is inside the same step's
    collectives): one line naming the rank and where it was, no hang, the step-1
    checkpoint intact and resumable."""
    with one_torch_thread():
        groups = make_groups(tiny_llama(seed=0), n_groups=3, seed=1)
        single = Learner(tiny_llama(seed=0), None, resolve(make_cfg(**ONE)).learner)
    hold = Fault(1, 2, "backward", "hold")  # rank 1 stops there; killed below
    with closing(LearnerProcess(make_cfg(**GROUP), fault=hold)) as group:
        group.step(groups)
        assert [p.phase for p in group.phases().values()] == ["metrics all-reduce"] * 2
        saved = group.save_checkpoint(tmp_path / "ckpt")
        step = _InThread(lambda: group.step(groups))
        assert group.wait_for_phase(1, "backward", fault="hold") == RankPhase(2, "backward", "hold")
        group.wait_for_phase(0, "backward")  # rank 0 is in step 2 too, waiting on rank 1
        os.kill(group.pids[1], signal.SIGKILL)
        error = step.outcome()
    assert isinstance(error, LearnerError)
    message = str(error)
    assert "\n" not in message
    assert message.startswith(
        "learner rank 1 died while training a step (killed by signal 9; it was in backward "
        "of step 2, held there by an injected fault); the last checkpoint is intact"
    ), message
    assert all(_gone(pid) for pid in group.pids)
    with one_torch_thread():
        single.step(groups)
        resumed = Learner(tiny_llama(seed=1), None, resolve(make_cfg(**ONE)).learner)
        resumed.load_checkpoint(saved)
    assert resumed.version == 1
    assert max_diff(resumed.model.state_dict(), single.model.state_dict()) < 1e-4


@pytest.mark.integration
def test_a_rank_that_stops_taking_part_times_the_collective_out() -> None:
    """DDP: rank 1 holds in its first backward, rank 0 waits in the gradient all-reduce,
    which gives up after learner.collective_timeout_s with one line naming both ranks."""
    cfg = make_cfg(
        **{**GROUP, "learner": {**GROUP["learner"], "parallel": "ddp", "collective_timeout_s": 3}}
    )
    with one_torch_thread():
        groups = make_groups(tiny_llama(seed=0), n_groups=3, seed=1)
    with closing(LearnerProcess(cfg, fault=Fault(1, 1, "backward", "hold"))) as group:
        step = _InThread(lambda: group.step(groups))
        group.wait_for_phase(1, "backward", fault="hold")
        group.wait_for_phase(0, "gradient all-reduce")  # the collective rank 1 never joins
        error = step.outcome()
    assert isinstance(error, LearnerError)
    assert str(error) == (
        "learner rank 0 waited 3 s (learner.collective_timeout_s) for the other ranks in a "
        "collective in gradient all-reduce of step 1 while training a step: rank 1 last seen "
        "in backward of step 1, held there by an injected fault; the group is stopped, "
        "the last checkpoint is intact"
    )
    assert "Timed out" in str(error.__cause__)  # gloo's own timeout ended the wait
    assert all(_gone(pid) for pid in group.pids)


@pytest.mark.integration  # three CLI runs on 2 ranks (~7 min on 2 cores shared by others)
@pytest.mark.timeout(1200)
def test_a_run_whose_rank_dies_mid_step_resumes_through_the_cli(tmp_path: Path) -> None:
    """`agentrl train` on 2 FSDP ranks; rank 1 SIGKILLed inside step 2's backward: the run
    exits with one line naming it, the step-1 checkpoint intact; `--resume` finishes step 2
    with the very weights of a run that was never interrupted."""
    import subprocess

    from safetensors.torch import load_file

    from agentrl.runfolder import latest_checkpoint
    from tests.orchestrator.test_train import REPO, _cli_train

    (tmp_path / "c.yaml").write_text("{}\n")
    sets = [
        "learner.world_size=2",
        "learner.parallel=fsdp",
        "orchestrator.max_staleness=0",
        "orchestrator.max_steps=2",
        "orchestrator.checkpoint_every=1",
        # the same episodes in every run (see test_resume_after_sigkill_gives_the_...)
        "sampler.seed=7",
        "sampler.max_batch_size=1",
        "sampler.options.prefix_cache_tokens=0",
        "rollout.concurrency=4",
    ]
    cfg, killed_dir, straight_dir = tmp_path / "c.yaml", tmp_path / "killed", tmp_path / "straight"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(FAULT_ENV, None)
    runs = {
        name: subprocess.Popen(
            _cli_train(cfg, run_dir, *sets),
            cwd=REPO,
            env={**env, FAULT_ENV: "1:2:backward:kill"} if name == "killed" else env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, run_dir in (("straight", straight_dir), ("killed", killed_dir))
    }
    out = {name: proc.communicate(timeout=900)[1] for name, proc in runs.items()}
    assert runs["straight"].returncode == 0, out["straight"][-3000:]
    assert runs["killed"].returncode != 0
    assert out["killed"].strip().splitlines()[-1] == (
        "error: learner rank 1 died while training a step (killed by signal 9; it was in "
        "backward of step 2, killed there by an injected fault); the last checkpoint "
        "is intact"
    ), out["killed"][-3000:]
    ckpt = latest_checkpoint(killed_dir)
    assert ckpt is not None and ckpt.name == "step_000001"
    step1 = load_file(str(ckpt / "learner" / "model.safetensors"))

    resumed = subprocess.run(
        _cli_train(cfg, killed_dir, *sets, resume=True),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [s["step"] for s in read_steps(killed_dir)] == [1, 2]
    final = {}
    for name, run_dir in (("straight", straight_dir), ("killed", killed_dir)):
        last = latest_checkpoint(run_dir)
        assert last is not None and last.name == "step_000002", last
        final[name] = load_file(str(last / "learner" / "model.safetensors"))
    assert final["killed"].keys() == final["straight"].keys() == step1.keys()
    assert any(not v.equal(step1[k]) for k, v in final["killed"].items())  # step 2 trained
    differ = [k for k, v in final["straight"].items() if not v.equal(final["killed"][k])]
    assert not differ, f"resumed weights differ from the uninterrupted run's in {differ[:5]}"


@pytest.mark.parametrize(
    "value",
    [
        "1:2:backward",
        "x:2:backward:kill",
        "1:2:sideways:kill",
        "1:0:forward:kill",
        "1:2:forward:pause",
    ],
)
def test_a_malformed_fault_is_one_line(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(FAULT_ENV, value)
    with pytest.raises(
        ConfigError, match=r"AGENTRL_LEARNER_FAULT=.* is not RANK:STEP:PHASE:ACTION"
    ):
        Fault.from_env()
    monkeypatch.setenv(FAULT_ENV, "1:2:gradient all-reduce:hold")
    assert Fault.from_env() == Fault(1, 2, "gradient all-reduce", "hold")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_world_size_needs_the_learner_in_processes() -> None:
    cfg = make_cfg(**GROUP)
    assert learner_worker(cfg) == "process"
    cfg.orchestrator.learner_worker = "thread"
    with pytest.raises(ConfigError, match=r"learner\.world_size=2 runs the learner in 2 processes"):
        learner_worker(cfg)


def test_a_learner_outside_a_group_is_told_how_to_start_one() -> None:
    with pytest.raises(ConfigError, match=r"joined no torch\.distributed group"):
        Learner(tiny_llama(seed=0), None, resolve(make_cfg(**GROUP)).learner)


@pytest.mark.integration
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_run_trains_on_two_ranks_and_resumes_on_one(tmp_path: Path, parallel: str) -> None:
    """The run layer end to end: 2 steps on 2 ranks, then --resume on one to step 3."""
    from tests.orchestrator.test_train import _run, _weights_changed

    two = ["learner.world_size=2", f"learner.parallel={parallel}", "orchestrator.max_steps=2"]
    orch = _run(tmp_path, *two)
    assert orch.step == 2 and _weights_changed(orch)
    assert (orch.run_dir / "checkpoints" / "step_000002" / "learner" / "sharded").is_dir() == (
        parallel == "fsdp"
    )
    from agentrl.run.export import export_checkpoint

    folder = export_checkpoint(orch.run_dir, tmp_path / "hf")  # one Hugging Face folder
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert not (folder / "sharded").exists()
    resumed = _run(tmp_path, "orchestrator.max_steps=3", resume=True)
    assert resumed.step == 3


@pytest.mark.integration
def test_two_ranks_under_ray(tmp_path: Path) -> None:
    """orchestrator.backend=ray: rank 0 on the driver's node, rank 1 in the learner's
    placement group; 2 steps train, checkpoint sharded."""
    pytest.importorskip("ray")
    from tests.orchestrator.test_train import _run, _weights_changed
    from tests.placement.test_ray_backend import SMALL

    ranks = ["learner.world_size=2", "learner.parallel=fsdp", "orchestrator.max_steps=2"]
    orch = _run(tmp_path, *SMALL, "ray.learner.num_cpus=0.25", *ranks)
    assert orch.step == 2 and _weights_changed(orch)
    assert (orch.run_dir / "checkpoints" / "step_000002" / "learner" / "sharded").is_dir()


@pytest.mark.integration
def test_two_ranks_under_ray_match_one_process(tmp_path: Path) -> None:
    """The Ray placement of the group (rank 0 a LearnerShell on the driver's node, rank 1 a
    LearnerRankShell in the learner's placement group, as a run assembles them): 3 steps
    on the same batches give one process's weights (float32 tolerance) and losses; rank 1
    killed inside step 4's backward is named by the failed step."""
    ray = pytest.importorskip("ray")
    from safetensors.torch import load_file

    from agentrl.run.placement import cluster
    from agentrl.run.placement.actors import LearnerShell
    from agentrl.run.placement.assemble import _learner_ranks

    cfg = make_cfg(
        **{
            **GROUP,
            "orchestrator": {"cpu_threads": 1, "backend": "ray"},
            "ray": {"num_cpus": 2, "learner": {"num_cpus": 0.5}},
        }
    )
    with one_torch_thread():
        groups = make_groups(tiny_llama(seed=0), n_groups=3, seed=1)
        single = Learner(tiny_llama(seed=0), None, resolve(make_cfg(**ONE)).learner)
    conn = cluster.connect(cfg)
    try:
        on_ray = {"num_cpus": 0.5, "max_restarts": 0}
        kill = Fault(1, 4, "backward", "kill")
        peers, address = _learner_ranks(conn, cfg, on_ray, cfg.ray.start_timeout_s, kill)
        assert len(peers) == 1 and len(conn.placement_groups) == 1
        rank0 = (
            ray.remote(LearnerShell)
            .options(**on_ray, max_concurrency=1, **cluster.on_this_node(ray))
            .remote(cfg, peers, address)
        )
        for step in range(1, 4):
            theirs, version, _, credit = ray.get(rank0.step.remote(groups))
            with one_torch_thread():
                mine = single.step(groups)
            assert version == step and credit.estimator == single.last_credit.estimator
            assert theirs["loss/total"] == pytest.approx(mine["loss/total"], rel=1e-4, abs=1e-6)
        saved = Path(ray.get(rank0.save_checkpoint.remote(str(tmp_path / "ckpt"))))
        with pytest.raises(ray.exceptions.RayTaskError) as failed:
            ray.get(rank0.step.remote(groups))
        assert isinstance(failed.value.cause, LearnerError)
        assert str(failed.value.cause) == (
            "learner rank 1 died while training a step (ActorDiedError); the last checkpoint "
            "is intact"
        )
    finally:
        conn.close()
    assert (saved / "sharded").is_dir()
    trained = load_file(str(saved / "model.safetensors"))  # gathered on rank 0
    reference = single.model.state_dict()
    assert trained.keys() <= reference.keys()
    for name, w in trained.items():
        torch.testing.assert_close(w, reference[name], rtol=1e-4, atol=2e-5, msg=name)
    assert max_diff(tiny_llama(seed=0).state_dict(), trained) > 1e-4  # the steps trained


@pytest.mark.parametrize(
    ("learner", "message"),
    [
        ({"parallel": "fsdp", "fp16": "on"}, r"learner\.parallel=fsdp does not take learner\.fp16"),
        ({"cpu_offload": True}, r"learner\.cpu_offload=true offloads FSDP2's shards"),
        ({"world_size": 0}, r"world_size"),
        ({"parallel": "zero3"}, r"parallel"),
    ],
)
def test_bad_learner_group_settings_are_one_line(learner: dict, message: str) -> None:
    from agentrl.config import config_from_dict

    with pytest.raises(Exception, match=message):
        config_from_dict({"learner": learner})
