"""orchestrator.backend=ray on the tiny model: a local instance, a two-node cluster on one
host, a sampler actor killed mid-run, resume after SIGKILL of the driver.

Small num_cpus per role so every actor fits the 2-core test machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import pytest
import torch

ray = pytest.importorskip("ray")

from agentrl.config import load_config  # noqa: E402
from agentrl.models import load_model  # noqa: E402
from agentrl.run.events import BatchTrained, CheckpointSaved  # noqa: E402
from agentrl.run.orchestrator import Orchestrator  # noqa: E402
from agentrl.run.plotting import read_steps  # noqa: E402
from agentrl.runfolder import latest_checkpoint  # noqa: E402
from tests.orchestrator.test_train import BASE, REPO  # noqa: E402
from tests.procs import alive, live_descendants  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

SMALL = [
    "orchestrator.backend=ray",
    "ray.num_cpus=2",
    "ray.samplers.num_cpus=0.5",
    "ray.rollout_workers.num_cpus=0.25",
    "ray.learner.num_cpus=0.5",
]


def _orchestrator(run_dir: Path, *overrides: str) -> Orchestrator:
    cfg = load_config(overrides=[*BASE, *overrides])
    orch = Orchestrator(cfg, run_dir)
    orch.build()
    return orch


def _keys(run_dir: Path) -> set[str]:
    return {k for s in read_steps(run_dir) for k in s if not k.startswith("placement/")}


def _groups(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "trajectories.jsonl").read_text().splitlines()]


@pytest.mark.slow  # a minute or more of Ray actors (a local instance per run): make test-slow
def test_three_steps_on_ray_are_token_exact_with_local_metrics(tmp_path):
    sync = ["orchestrator.max_steps=3", "orchestrator.max_staleness=0"]
    local = _orchestrator(tmp_path / "local", *sync)
    anyio.run(local.run)
    orch = _orchestrator(tmp_path / "ray", *sync, *SMALL)
    assert not ray.is_initialized() or orch.parts.placement.conn.started_here
    anyio.run(orch.run)
    assert not ray.is_initialized()  # the local instance stopped with the run
    steps = read_steps(tmp_path / "ray")
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert _keys(tmp_path / "ray") == _keys(tmp_path / "local")
    assert orch.learner.version == 3
    # token exact: the sampled ids and behaviour log-probs the learner trains on are the
    # ones the replica produced with version-0 weights (recomputed here, same tiny model)
    model, _ = load_model("tiny-llama", dtype="float32")
    first = [g for g in _groups(tmp_path / "ray") if g["metadata"]["task_index"] < 2]
    assert first
    for group in first:
        for traj in group["trajectories"]:
            assert traj["status"] == "ok"  # the prefix check passed after every turn
            prompt, gen = traj["segments"]
            assert gen["kind"] == "model" and set(gen["versions"]) == {0}
            ids = torch.tensor([prompt["token_ids"] + gen["token_ids"]])
            with torch.no_grad():
                logits = model(ids).logits[0, len(prompt["token_ids"]) - 1 : -1]
            logp = torch.log_softmax(logits.float(), -1)
            recomputed = logp.gather(1, torch.tensor(gen["token_ids"])[:, None])[:, 0]
            assert torch.allclose(recomputed, torch.tensor(gen["logprobs"]), atol=2e-4)
    # sync mode: every step trained on the weights just published (staleness 0)
    later = [g for g in _groups(tmp_path / "ray") if g["metadata"]["task_index"] >= 2]
    assert all(
        set(t["segments"][1]["versions"]) <= {1, 2} for g in later for t in g["trajectories"]
    )


@pytest.mark.slow  # a minute or more of Ray actors (a local instance per run): make test-slow
def test_two_nodes_samplers_and_rollout_workers_apart(tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {"samplers": 4}},
    )
    cluster.add_node(num_cpus=1, resources={"rollout": 4})
    try:
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        orch = _orchestrator(
            tmp_path / "run",
            "orchestrator.max_steps=2",
            "orchestrator.max_staleness=1",
            "orchestrator.backend=ray",
            "ray.samplers.replicas=2",
            "ray.samplers.num_cpus=0.25",
            "ray.samplers.resources={samplers: 1}",
            "ray.rollout_workers.num_cpus=0.25",
            "ray.rollout_workers.resources={rollout: 1}",
            "ray.learner.num_cpus=0.25",
            "ray.weight_transport=gloo",
        )
        where = orch.parts.placement.describe()
        sampler_nodes = {s["node"] for s in where["samplers"]}
        worker_nodes = {w["node"] for w in where["rollout_workers"]}
        assert len(sampler_nodes) == 1 and len(worker_nodes) == 1
        assert sampler_nodes != worker_nodes  # on different nodes
        anyio.run(orch.run)
        assert [s["step"] for s in read_steps(tmp_path / "run")] == [1, 2]
        assert ray.is_initialized()  # a connection the caller made stays open
    finally:
        ray.shutdown()
        cluster.shutdown()
    # gloo broadcast reached every replica with the same version
    assert orch.weight_bus.last["held"] == [2, 2]
    assert orch.weight_bus.last["missed"] == 0


@pytest.mark.slow  # a minute or more of Ray actors and CLI runs: make test-slow
def test_killed_rollout_worker_and_sampler_actors_lose_episodes_not_the_run(tmp_path):
    orch = _orchestrator(
        tmp_path / "run",
        "orchestrator.max_steps=4",
        "orchestrator.max_staleness=1",
        "sampler.max_new_tokens=48",
        *SMALL,
        "ray.samplers.replicas=2",
        "ray.samplers.num_cpus=0.25",
        "ray.rollout_workers.replicas=2",
        "ray.rollout_workers.num_cpus=0.25",
        "ray.max_restarts=1",
    )
    worker = orch.parts.placement.workers[0]
    sampler = orch.parts.placement.samplers[0]
    engine = orch.rollout
    killed = {"worker": threading.Event(), "sampler": threading.Event()}
    second_step = threading.Event()
    orch.events.subscribe(
        lambda e: isinstance(e, BatchTrained) and e.step >= 2 and second_step.set()
    )
    run_over = threading.Event()
    failed: list[str] = []

    def ended() -> str | None:
        return "the run finished first" if run_over.is_set() else None

    def kill_while_busy() -> None:
        # SIGKILL-like: each actor dies with work in flight and Ray restarts it; first a
        # sampler generating, then (once a step has counted what that lost) a rollout
        # worker running groups
        try:
            wait_until(
                lambda: ray.get(sampler.stats.remote(), timeout=30)["active"] > 0,
                "the sampler actor generating",
                interval=0.01,
                abort=ended,
            )
            ray.kill(sampler, no_restart=False)
            killed["sampler"].set()
            wait_until(second_step.is_set, "step 2 trained", abort=ended)
            wait_until(
                lambda: engine.outstanding[0] > 0,
                "rollout worker 0 running a group",
                interval=0.01,
                abort=ended,
            )
            ray.kill(worker, no_restart=False)
            killed["worker"].set()
        except AssertionError as e:
            failed.append(str(e))

    killer = threading.Thread(target=kill_while_busy)
    killer.start()
    try:
        anyio.run(orch.run)
    finally:
        run_over.set()
        killer.join()
    assert not failed, failed
    steps = read_steps(tmp_path / "run")
    assert killed["worker"].is_set() and killed["sampler"].is_set()
    assert [s["step"] for s in steps] == [1, 2, 3, 4]  # the run finished every step
    # the dead worker's groups ran again on a live worker: counted, none lost
    assert steps[-1]["placement/groups_redispatched"] >= 1
    assert steps[-1]["placement/rollout_workers_lost"] == 1
    lost = steps[-1]["placement/sampler_requests_lost"]  # cumulative over the run
    assert lost >= 1  # counted: those episodes were retried on the other replica or masked
    assert sum(s.get("infra_errors", 0) for s in steps) <= lost


@pytest.mark.slow  # a minute or more of Ray actors (a local instance per run): make test-slow
def test_a_dead_learner_actor_ends_the_run_in_one_line_with_a_checkpoint(tmp_path):
    from agentrl.errors import user_error

    orch = _orchestrator(
        tmp_path / "run",
        "orchestrator.max_steps=6",
        "orchestrator.checkpoint_every=1",
        "orchestrator.max_staleness=1",
        *SMALL,
    )
    learner = orch.parts.placement.learner
    killed: list[int] = []

    def kill_after_the_first_checkpoint(event: object) -> None:
        # the moment is the event: the loop has just saved a checkpoint
        if isinstance(event, CheckpointSaved) and not killed:
            ray.kill(learner, no_restart=True)
            killed.append(event.step)

    orch.events.subscribe(kill_after_the_first_checkpoint)
    with pytest.raises(BaseException) as caught:
        anyio.run(orch.run)
    assert killed == [1]
    said = str(user_error(caught.value))
    assert said.startswith("the learner actor died while "), said
    assert "--resume" in said and "\n" not in said, said
    assert latest_checkpoint(tmp_path / "run") is not None  # what --resume starts from


def _driver(run_dir: Path, steps: int, *extra: str) -> list[str]:
    args = [sys.executable, "-m", "agentrl.cli", "train", "configs/demo.yaml"]
    args += [*extra, "--no-summary"]
    for s in [
        *BASE,
        *SMALL,
        f"orchestrator.max_steps={steps}",
        "orchestrator.checkpoint_every=1",
        "orchestrator.max_staleness=1",
    ]:
        args += ["--set", s]
    return args


@pytest.mark.slow  # a minute or more of Ray actors and CLI runs: make test-slow
def test_resume_after_sigkill_of_the_driver(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        _driver(run_dir, 50, "--run-dir", str(run_dir)),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(
            lambda: latest_checkpoint(run_dir) is not None,
            "the first checkpoint",
            interval=0.2,
            abort=lambda: (
                f"training exited early: {proc.stderr.read().decode()[-2000:]}"
                if proc.poll() is not None
                else None
            ),
        )
        tree = live_descendants(proc.pid)  # Ray's processes and actors
        assert tree
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    # Ray's processes notice their driver's death on their own: wait for them to go
    wait_until(lambda: not any(alive(p) for p in tree), "Ray's processes gone after the driver")
    killed_at = json.loads((latest_checkpoint(run_dir) / "orchestrator.json").read_text())["step"]
    done = subprocess.run(
        _driver(run_dir, killed_at + 1, "--resume", str(run_dir)),
        cwd=REPO,
        capture_output=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    steps = [s["step"] for s in read_steps(run_dir)]
    assert sorted(set(steps)) == list(range(1, killed_at + 2))  # nothing lost
    state = json.loads((latest_checkpoint(run_dir) / "orchestrator.json").read_text())
    assert state["step"] == state["version"] == killed_at + 1


def test_bad_placement_is_one_line_before_any_model_loads(tmp_path, monkeypatch):
    from agentrl.errors import ConfigError

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(ConfigError, match=r"RAY_ADDRESS=127.0.0.1:9: nothing answers"):
        _orchestrator(tmp_path / "a", *SMALL)
    monkeypatch.delenv("RAY_ADDRESS")
    with pytest.raises(
        ConfigError, match=r"ray.samplers.num_gpus=1 .* set ray.samplers.num_gpus=0"
    ):
        _orchestrator(tmp_path / "b", *SMALL, "ray.samplers.num_gpus=1")
    assert not ray.is_initialized()
    # an environment nothing can import is named by the config check, before Ray starts
    with pytest.raises(ConfigError, match=r"env.name \(--set env.name=no_such_pkg.env:Env\)"):
        _orchestrator(tmp_path / "c", *SMALL, "env.name=no_such_pkg.env:Env")
    assert not ray.is_initialized()


@pytest.mark.slow  # two local Ray instances started and stopped
def test_a_local_instance_is_sized_for_the_default_roles_and_a_small_one_is_one_line():
    from agentrl.errors import ConfigError
    from agentrl.run.placement import cluster

    # the defaults reserve 3 CPUs (sampler + rollout worker + learner): a local instance
    # holds at least that many scheduling tokens, even on a 2-core machine
    cfg = load_config(overrides=["orchestrator.backend=ray"])
    assert cluster.total_demand(cfg) == {"CPU": 3.0}
    assert cluster.local_num_cpus(cfg) == max(os.cpu_count() or 1, 3)
    conn = cluster.connect(cfg)
    try:
        assert ray.cluster_resources()["CPU"] >= 3
        cluster.check_resources(cfg, ray)
    finally:
        conn.close()
    # a size the user chose is kept, and too small for the roles is one line
    small = load_config(overrides=["orchestrator.backend=ray", "ray.num_cpus=2"])
    assert cluster.local_num_cpus(small) == 2
    conn = cluster.connect(small)
    try:
        with pytest.raises(ConfigError, match=r"asks for 3 CPU in all .* the cluster has 2"):
            cluster.check_resources(small, ray)
    finally:
        conn.close()
