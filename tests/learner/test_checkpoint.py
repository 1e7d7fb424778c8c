"""Learner checkpoints: exact resume, RNG states, atomic writes, SIGKILL mid-save."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from agentrl.errors import CheckpointError
from agentrl.learner import Learner
from agentrl.learner.schedule import lr_lambda
from agentrl.run.settings import resolve
from agentrl.runfolder import atomic_directory, resolve_checkpoint
from agentrl.types import TrajectoryGroup
from tests.learner.conftest import make_cfg, make_groups

REPO = Path(__file__).resolve().parents[2]


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


def _strip_times(m: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in m.items() if not k.startswith("time/") and k != "tokens_per_s"}


@pytest.mark.parametrize(
    "algorithm",
    [{"advantage": "grpo", "off_policy": "decoupled"}, {"advantage": "gae", "critic": True}],
    ids=["grpo-decoupled", "ppo-gae"],
)
def test_resume_reproduces_the_next_step_exactly(
    algorithm: dict,
    tmp_path: Path,
    fresh_model: Callable[[], torch.nn.Module],
    base_model: torch.nn.Module,
    groups: list[TrajectoryGroup],
) -> None:
    cfg = make_cfg(
        algorithm=algorithm,
        learner={"minibatches": 2, "ppo_epochs": 2, "warmup_steps": 2, "schedule": "cosine"},
    )
    second = make_groups(base_model, seed=7)
    a = Learner(fresh_model(), None, resolve(cfg).learner)
    a.step(groups)
    a.save_checkpoint(tmp_path / "ckpt")
    draws_a = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    metrics_a = a.step(second)

    other = fresh_model()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    b = Learner(other, None, resolve(cfg).learner, seed=123)
    b.load_checkpoint(tmp_path / "ckpt")
    assert (b.version, b.step_count) == (1, 1)
    draws_b = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    assert draws_a == draws_b
    metrics_b = b.step(second)
    assert torch.equal(_flat(a.model), _flat(b.model))
    assert _strip_times(metrics_a) == _strip_times(metrics_b)
    assert b.version == 2
    assert b.optimizer.param_groups[0]["lr"] == a.optimizer.param_groups[0]["lr"]


def test_resume_keeps_the_adapted_kl_beta(
    tmp_path: Path,
    fresh_model: Callable[[], torch.nn.Module],
    base_model: torch.nn.Module,
    groups: list[TrajectoryGroup],
) -> None:
    """Adaptive-KL PPO: beta (and the KL seen since it was last adapted) survive a resume,
    so the resumed run trains with the beta of an uninterrupted one, not the configured one."""
    cfg = make_cfg(
        algorithm={
            "policy_loss": "ppo_adaptive_kl",
            "off_policy": "decoupled",
            "options": {"kl_beta": 1.0, "kl_target": 1e-9},
        },
        learner={"minibatches": 2, "ppo_epochs": 2},
    )
    second, third = make_groups(base_model, seed=7), make_groups(base_model, seed=8)
    a = Learner(fresh_model(), None, resolve(cfg).learner)
    a.step(groups)
    a.step(second)
    assert a.objective.adaptive_kl is not None and a.objective.adaptive_kl.beta != 1.0
    a.save_checkpoint(tmp_path / "ckpt")
    metrics_a = a.step(third)  # uninterrupted

    b = Learner(fresh_model(), None, resolve(cfg).learner)
    b.load_checkpoint(tmp_path / "ckpt")
    metrics_b = b.step(third)  # resumed
    assert metrics_b["pg/kl_beta"] == metrics_a["pg/kl_beta"] != 1.0
    assert b.objective.state_dict() == a.objective.state_dict()
    assert torch.equal(_flat(a.model), _flat(b.model))


def test_checkpoint_files_and_critic_mismatch(
    tmp_path: Path, fresh_model: Callable[[], torch.nn.Module]
) -> None:
    learner = Learner(fresh_model(), None, resolve(make_cfg()).learner)
    out = learner.save_checkpoint(tmp_path / "c")
    names = sorted(p.name for p in out.iterdir())
    assert names == ["COMPLETE", "learner.json", "model.safetensors", "trainer_state.pt"]
    ppo = Learner(
        fresh_model(),
        None,
        resolve(make_cfg(algorithm={"advantage": "gae", "critic": True})).learner,
    )
    with pytest.raises(CheckpointError, match="critic=False"):
        ppo.load_checkpoint(out)
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        learner.load_checkpoint(tmp_path / "missing")


def test_atomic_directory_keeps_the_old_one_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("v1")
    with pytest.raises(RuntimeError), atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("v2-partial")
        raise RuntimeError("killed mid-save")
    assert (target / "a.txt").read_text() == "v1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_resolve_recovers_from_a_kill_between_the_renames(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("v1")
    # the state after `rename(path, old)` and before `rename(tmp, path)`
    os.rename(target, tmp_path / ".ckpt.old-1")
    assert (resolve_checkpoint(target) / "a.txt").read_text() == "v1"
    # a complete newer tmp wins over the old one
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("v2")
    os.rename(target, tmp_path / ".ckpt.tmp-2")
    with atomic_directory(tmp_path / "scratch") as tmp:
        (tmp / "a.txt").write_text("v1")
    os.rename(tmp_path / "scratch", tmp_path / ".ckpt.old-3")
    os.utime(tmp_path / ".ckpt.tmp-2")
    assert (resolve_checkpoint(target) / "a.txt").read_text() == "v2"


CHILD = textwrap.dedent(
    """
    import sys, torch
    sys.path.insert(0, {repo!r})
    torch.set_num_threads(1)
    from agentrl.learner import Learner
    from agentrl.models import tiny_llama
    from agentrl.run.settings import resolve
    from tests.learner.conftest import make_cfg, make_groups
    model = tiny_llama(seed=0)
    groups = make_groups(model, n_groups=1, group_size=2, seed=1)
    learner = Learner(model, None, resolve(make_cfg()).learner)
    real_save = torch.save

    def save_then_hold(obj, path, *args, **kwargs):  # the "saving" signal of a later save
        real_save(obj, path, *args, **kwargs)
        if learner.version > 1:
            print("inside save", learner.version, flush=True)
            sys.stdin.readline()  # held here, mid-save, until the parent kills it

    torch.save = save_then_hold
    while True:
        learner.step(groups)
        learner.save_checkpoint({ckpt!r})
        print("saved", learner.version, flush=True)
    """
)


def test_sigkill_mid_save_leaves_a_loadable_checkpoint(
    tmp_path: Path, fresh_model: Callable[[], torch.nn.Module]
) -> None:
    ckpt = tmp_path / "ckpt"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(repo=str(REPO), ckpt=str(ckpt))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # first save finished
        assert line.startswith("saved 1"), line
        # the second save has written its weights and trainer state, not its metadata
        line = proc.stdout.readline()
        assert line.startswith("inside save 2"), line
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    learner = Learner(fresh_model(), None, resolve(make_cfg()).learner)
    learner.load_checkpoint(ckpt)
    assert learner.version == 1  # the complete first save, untouched by the killed one


def test_lr_schedules() -> None:
    const = lr_lambda("constant", 2, 10)
    assert [const(s) for s in range(4)] == pytest.approx([1 / 3, 2 / 3, 1, 1])
    lin = lr_lambda("linear", 0, 10)
    assert lin(0) == 1 and lin(5) == pytest.approx(0.5) and lin(10) == 0
    cos = lr_lambda("cosine", 1, 11)
    assert cos(1) == 1 and cos(6) == pytest.approx(0.5) and cos(11) == pytest.approx(0)
    with pytest.raises(ValueError, match=r"learner\.schedule must be one of"):
        lr_lambda("exp", 0, 10)
