"""End-to-end training runs on the tiny model: every algorithm, sync and async, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.run.orchestrator import Orchestrator
from agentrl.run.placement.learner_process import LearnerProcess
from agentrl.run.plotting import read_steps
from agentrl.runfolder import latest_checkpoint
from tests.procs import alive
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]

BASE = [
    "model.name=tiny-llama",
    "model.dtype=float32",
    "env.name=tests.orchestrator.parity_env:ParityEnv",
    "sampler.max_new_tokens=4",
    "sampler.max_batch_size=16",
    "rollout.group_size=4",
    "rollout.concurrency=16",
    "rollout.max_turns=1",
    "rollout.max_tokens=64",
    "learner.batch_groups=2",
    "learner.micro_batch_size=8",
    "learner.lr=1e-3",
    "orchestrator.checkpoint_every=0",
    "logging.progress=false",
]


def _run(tmp_path: Path, *overrides: str, resume: bool = False) -> Orchestrator:
    cfg = load_config(overrides=[*BASE, *overrides])
    orch = Orchestrator(cfg, tmp_path / "run", resume=resume)
    orch.build()
    anyio.run(orch.run)
    return orch


def _weights_changed(orch: Orchestrator) -> bool:
    """The final checkpoint's weights differ from the initial ones (either learner worker)."""
    from safetensors.torch import load_file

    from agentrl.models import load_model

    fresh, _ = load_model("tiny-llama", dtype="float32")
    ckpt = latest_checkpoint(orch.run_dir)
    assert ckpt is not None  # the last step always checkpoints
    trained = load_file(str(ckpt / "learner" / "model.safetensors"))
    return any(not v.equal(trained[k]) for k, v in fresh.state_dict().items() if k in trained)


def _trained_staleness(run_dir: Path) -> list[tuple[int, int]]:
    """Per trained step, (max staleness of its tokens, the learner's version then), recomputed
    from the files: token versions from trajectories.jsonl, which groups each step trained
    and the version it produced from metrics.jsonl."""
    from agentrl.types import TrajectoryGroup

    with (run_dir / "trajectories.jsonl").open() as f:
        groups = {g.group_id: g for g in map(TrajectoryGroup.from_json, f)}
    out = []
    for line in (run_dir / "metrics.jsonl").open():
        event = json.loads(line)
        if event["event"] != "BatchTrained":
            continue
        trained_at = event["version"] - 1  # the step's update produced `version`
        versions = [
            v
            for gid in event["group_ids"]
            for t in groups[gid].trajectories
            for seg in t.segments
            if seg.kind == "model"
            for v in seg.versions
        ]
        assert versions, f"step {event['step']} trained no model tokens"
        out.append((trained_at - min(versions), trained_at))
    return out


def _learner_children(pid: int) -> list[int]:
    """Learner worker processes whose parent is `pid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmd = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and b"agentrl.run.placement.learner_child" in cmd:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.parametrize(
    "algo",
    [
        ["algorithm.advantage=grpo"],
        ["algorithm.advantage=dr_grpo", "algorithm.agg=seq-mean-token-sum-norm"],
        ["algorithm.advantage=rloo"],
        ["algorithm.advantage=reinforce_pp"],
        [
            "algorithm.advantage=grpo",
            "algorithm.policy_loss=gspo",
            "algorithm.eps_low=0.0003",
            "algorithm.eps_high=0.0004",
        ],
        ["algorithm.advantage=grpo", "algorithm.dynamic_sampling=true", "algorithm.eps_high=0.28"],
        [
            "algorithm.advantage=gae",
            "algorithm.critic=true",
            "learner.ppo_epochs=2",
            "learner.minibatches=2",
        ],
        ["algorithm.advantage=grpo", "algorithm.kl=k3", "algorithm.kl_coef=0.1"],
        ["algorithm.advantage=grpo", "algorithm.off_policy=decoupled"],
    ],
    ids=[
        "grpo",
        "dr_grpo",
        "rloo",
        "reinforce_pp",
        "gspo",
        "dapo",
        "ppo_gae",
        "grpo_kl",
        "decoupled",
    ],
)
def test_each_algorithm_trains(tmp_path, algo, request):
    # the learner process (learner_worker: auto in async) for grpo and ppo_gae (a critic in
    # the child); the others in a thread: a child's start is ~9 of a run's ~10 s, and the
    # process path has its own tests (test_async_mode_bounds_staleness, tests/faults)
    worker = "auto" if request.node.callspec.id in ("grpo", "ppo_gae") else "thread"
    orch = _run(
        tmp_path,
        "orchestrator.max_steps=2",
        "orchestrator.max_staleness=1",
        f"orchestrator.learner_worker={worker}",
        *algo,
    )
    steps = read_steps(tmp_path / "run")
    assert [s["step"] for s in steps] == [1, 2]
    assert orch.learner.version == 2 and orch.sampler.version == 2
    assert "reward_mean" in steps[0]  # later async steps may train rollouts finished earlier
    for s in steps:
        assert s["loss/total"] == s["loss/total"]  # finite
        for key in (
            "batch/reward_mean",
            "groups_finished",
            "pg/clip_frac",
            "grad_norm",
            "entropy",
            "rollout_tokens_per_s",
            "sampler/prefix_reuse_frac",
        ):
            assert key in s, key
    assert _weights_changed(orch)


def test_sync_mode_is_on_policy(tmp_path):
    _run(tmp_path, "orchestrator.max_steps=3", "orchestrator.max_staleness=0")
    steps = read_steps(tmp_path / "run")
    assert len(steps) == 3
    assert all(s["staleness/max"] == 0 for s in steps)
    assert all(s["buffer/dropped_stale"] == 0 for s in steps)
    assert [st for st, _ in _trained_staleness(tmp_path / "run")] == [0, 0, 0]


@pytest.mark.parametrize("worker", ["process", "thread"])
def test_async_mode_bounds_staleness(tmp_path, worker):
    orch = _run(
        tmp_path,
        "orchestrator.max_steps=4",
        "orchestrator.max_staleness=2",
        f"orchestrator.learner_worker={worker}",
    )
    assert isinstance(orch.learner, LearnerProcess) == (worker == "process")
    steps = read_steps(tmp_path / "run")
    assert len(steps) == 4
    # recomputed from the files: the staleness each step reports is exactly that of the
    # tokens it trained, never beyond the bound
    recomputed = _trained_staleness(tmp_path / "run")
    assert [st for st, _ in recomputed] == [s["staleness/max"] for s in steps]
    assert all(st <= 2 for st, _ in recomputed)
    # and the run overlapped: a later step trained tokens that older weights sampled. All
    # 4 groups of the first wave (concurrency 16, group_size 4) sample their first token in
    # the sampler's first batch, at version 0, while step 1 needs two finished groups: the
    # two others are trained at version >= 1
    assert any(st >= 1 for st, trained_at in recomputed if trained_at >= 1), recomputed
    assert orch.learner.version == orch.sampler.version == 4
    assert _weights_changed(orch)
    if worker == "process":
        assert orch.learner._proc.returncode == 0  # the run closed its learner process


def test_dynamic_sampling_drops_are_counted(tmp_path):
    # G=2 with binary rewards: a group is "all equal" with probability ~1/2. Synchronous, so
    # the weights every group is sampled with (and hence its rewards) are reproducible
    _run(
        tmp_path,
        "orchestrator.max_steps=3",
        "orchestrator.max_staleness=0",
        "algorithm.dynamic_sampling=true",
        "rollout.group_size=2",
    )
    events = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    last_step = max(i for i, e in enumerate(events) if e["event"] == "BatchTrained")
    before = events[:last_step]
    finished = [e for e in before if e["event"] == "GroupFinished"]
    equal = [e for e in finished if e["reward_mean"] in (0.0, 1.0)]
    dropped = [
        e for e in before if e["event"] == "GroupDropped" and e["reason"] == "dropped_all_equal"
    ]
    last = read_steps(tmp_path / "run")[-1]
    assert len(equal) >= 1  # the path under test ran
    # every all-equal group was dropped and counted, and nothing else was
    assert last["buffer/dropped_all_equal"] == len(dropped) == len(equal)
    assert last["buffer/released"] == 3 * 2  # 3 steps x batch_groups, all mixed groups


@pytest.mark.parametrize("staleness", [0, 2])
def test_no_rollouts_beyond_what_the_steps_train(tmp_path, staleness):
    # every dropped group gets exactly one replacement, and no group starts that the
    # remaining steps cannot train (async used to keep sampling up to k batches past the end)
    orch = _run(
        tmp_path,
        "orchestrator.max_steps=3",
        f"orchestrator.max_staleness={staleness}",
        "algorithm.dynamic_sampling=true",
        "rollout.group_size=2",
        "orchestrator.learner_worker=thread",
    )
    events = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    finished = [e for e in events if e["event"] == "GroupFinished"]
    dropped = [e for e in events if e["event"] == "GroupDropped"]
    trained = 3 * 2  # steps x batch_groups
    steps = read_steps(tmp_path / "run")
    assert steps[-1]["buffer/released"] == trained
    assert orch.tasks.next_index == len(finished) == trained + len(dropped)
    # each step's rollout numbers cover the groups that finished since the step before (so
    # every finished group is counted once); a step during which none finished has none
    assert sum(s["groups_finished"] for s in steps) == len(finished)
    assert all(("reward_mean" in s) == (s["groups_finished"] > 0) for s in steps)
    assert "reward_mean" in steps[0]


@pytest.mark.slow  # two runs with a learner process; test_checkpoint_snapshot.py resumes too
def test_checkpoint_and_resume_continues_the_step_count(tmp_path):
    _run(tmp_path, "orchestrator.max_steps=2", "orchestrator.checkpoint_every=1")
    ckpt = latest_checkpoint(tmp_path / "run")
    assert ckpt is not None and ckpt.name == "step_000002"
    orch = _run(
        tmp_path, "orchestrator.max_steps=4", "orchestrator.checkpoint_every=1", resume=True
    )
    assert orch.step == 4 and orch.learner.version == 4
    assert [s["step"] for s in read_steps(tmp_path / "run")] == [1, 2, 3, 4]


@pytest.mark.slow  # demo.yaml async through the CLI, killed and resumed: make test-slow
def test_resume_after_sigkill(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "agentrl.cli",
        "train",
        "configs/demo.yaml",
        "--run-dir",
        str(run_dir),
        "--no-summary",
    ]
    sets = [*BASE, "orchestrator.max_steps=50", "orchestrator.checkpoint_every=1"]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(
            lambda: (
                (ck := latest_checkpoint(run_dir)) is not None and int(ck.name.split("_")[1]) >= 3
            ),
            "a checkpoint at step 3",
            abort=lambda: None if proc.poll() is None else proc.stderr.read().decode()[-2000:],
        )
        children = _learner_children(proc.pid)
        assert children, "demo.yaml is asynchronous: the learner runs in its own process"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    # the learner process dies with its parent (no orphan keeps training or holding memory)
    wait_until(lambda: not any(alive(c) for c in children), "the learner process to exit")
    killed_at = json.loads((latest_checkpoint(run_dir) / "orchestrator.json").read_text())["step"]
    resume_args = [
        a if a != "orchestrator.max_steps=50" else f"orchestrator.max_steps={killed_at + 2}"
        for a in args
    ]
    resume_args = [a for a in resume_args if a not in ("--run-dir", str(run_dir))] + [
        "--resume",
        str(run_dir),
    ]
    done = subprocess.run(resume_args, cwd=REPO, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    steps = [s["step"] for s in read_steps(run_dir)]
    assert steps[-1] == killed_at + 2
    assert sorted(set(steps)) == list(range(1, killed_at + 3))  # nothing lost
    ckpt_state = json.loads((latest_checkpoint(run_dir) / "orchestrator.json").read_text())
    assert ckpt_state["step"] == ckpt_state["version"] == killed_at + 2  # nothing repeated


def _cli_train(config: Path, run_dir: Path, *sets: str, resume: bool = False) -> list[str]:
    args = [sys.executable, "-m", "agentrl.cli", "train", str(config), "--no-summary"]
    args += ["--resume", str(run_dir)] if resume else ["--run-dir", str(run_dir)]
    for s in [*BASE, *sets]:
        args += ["--set", s]
    return args


@pytest.mark.slow  # three CLI processes (~30 s alone): make test-slow, and CI
def test_resume_after_sigkill_gives_the_uninterrupted_weights(tmp_path):
    # synchronous and deterministic: 2 steps straight vs 1 step, SIGKILL once the step-1
    # checkpoint is complete, --resume for the second step; the weights must be bit-equal
    from safetensors.torch import load_file

    (tmp_path / "c.yaml").write_text("{}\n")
    sets = [
        "env.name=tests.orchestrator.parity_env:HeldParityEnv",
        "orchestrator.max_staleness=0",
        "orchestrator.max_steps=2",
        "orchestrator.checkpoint_every=1",
        "sampler.seed=7",  # each episode's tokens from its own stream: no batch-mate effects
        # and each sequence decoded alone with no reused KV, so the sampler's log-probs
        # (pi_old here) are the same bits whatever order the requests arrive in
        "sampler.max_batch_size=1",
        "sampler.options.prefix_cache_tokens=0",
        # one group's episodes at a time: a step's groups finish (and are batched, which
        # orders the loss's sums) in task order, however the machine is loaded
        "rollout.concurrency=4",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cfg, killed_dir = tmp_path / "c.yaml", tmp_path / "killed"
    # the two first runs side by side. Episodes of tasks 2+ (step 2's, 2 groups a step)
    # never start in the held one: it trains, checkpoints step 1 and waits there, so the
    # kill lands at a known point
    straight = subprocess.Popen(
        _cli_train(cfg, tmp_path / "straight", *sets),
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    held = subprocess.Popen(
        _cli_train(cfg, killed_dir, *sets, "env.options.hold_from=2"),
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(
            lambda: (ck := latest_checkpoint(killed_dir)) is not None and ck.name == "step_000001",
            "the step-1 checkpoint of the run to kill",
            abort=lambda: None if held.poll() is None else held.stderr.read().decode()[-2000:],
        )
    finally:
        os.kill(held.pid, signal.SIGKILL)
        held.wait()
        _, err = straight.communicate(timeout=600)
    assert straight.returncode == 0, err.decode()[-3000:]
    resumed = subprocess.run(
        _cli_train(cfg, killed_dir, *sets, resume=True),
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    assert [s["step"] for s in read_steps(killed_dir)] == [1, 2]

    final = {}
    for name in ("straight", "killed"):
        ckpt = latest_checkpoint(tmp_path / name)
        assert ckpt is not None and ckpt.name == "step_000002", ckpt
        final[name] = load_file(str(ckpt / "learner" / "model.safetensors"))
    assert final["straight"].keys() == final["killed"].keys()
    differ = [k for k, v in final["straight"].items() if not v.equal(final["killed"][k])]
    assert not differ, f"resumed weights differ from the uninterrupted run's in {differ[:5]}"


def test_config_error_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"learner\.batch_groups"):
        load_config(overrides=[*BASE, "learner.batch_groups=0"])


def test_eval_reports_pass_and_maj_at_k(tmp_path):
    from agentrl.run.evaluation import evaluate

    # a learner thread: a child process's start is most of a short run, and beside the point
    _run(
        tmp_path,
        "orchestrator.max_steps=1",
        "orchestrator.checkpoint_every=1",
        "orchestrator.learner_worker=thread",
    )
    cfg = load_config(overrides=BASE)
    result = anyio.run(evaluate, cfg, tmp_path / "run", 3, 4)
    assert result["version"] == 1 and result["tasks"] == 3
    m = result["metrics"]
    assert 0.0 <= m["pass@1"] <= m["pass@2"] <= m["pass@4"] <= 1.0
    assert "maj@4" in m
    with pytest.raises(Exception, match="no complete checkpoint"):
        anyio.run(evaluate, cfg, tmp_path / "nowhere", 1, 2)


def test_a_run_that_can_never_form_a_batch_stops_with_a_clear_error(tmp_path):
    # every reward equal: dynamic sampling drops every group; the run must not spin
    (tmp_path / "c.yaml").write_text("{}\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentrl.cli",
            "train",
            str(tmp_path / "c.yaml"),
            "--run-dir",
            str(tmp_path / "run"),
            "--no-summary",
            *[f"--set={o}" for o in BASE],
            "--set=env.name=tests.orchestrator.parity_env:ConstantEnv",
            "--set=algorithm.dynamic_sampling=true",
            "--set=algorithm.max_dropped_groups=4",
            "--set=orchestrator.max_staleness=0",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "error: 4 groups in a row had all rewards equal" in out.stderr
    assert "Traceback" not in out.stderr
