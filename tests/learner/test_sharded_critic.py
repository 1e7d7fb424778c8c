"""A sharded learner with a critic (``learner.parallel: fsdp``, ``algorithm.critic``)
checkpoints and resumes it: FSDP2 on a group of one rank, in this process (the layout
code is the same at any world size; tests/placement/test_learner_group.py runs 2 ranks)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from agentrl.learner import Learner
from agentrl.learner.critic import ValueModel
from agentrl.models import tiny_llama
from agentrl.run.settings import resolve
from tests.learner.conftest import make_cfg, make_groups, one_torch_thread

GAE = {"advantage": "gae", "critic": True, "lam": 0.95, "vf_coef": 0.5}


@pytest.fixture
def fsdp_group() -> Iterator[None]:
    """The in-memory group of one that a world-size-1 FSDP learner joins, left afterwards."""
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def _learner(parallel: str, seed: int, separate: bool) -> Learner:
    cfg = make_cfg(learner={"parallel": parallel, "fused_logprobs": "off"}, algorithm=GAE)
    policy = tiny_llama(seed=seed)
    critic = ValueModel.from_policy(tiny_llama(seed=seed)) if separate else None
    return Learner(policy, None, resolve(cfg).learner, critic=critic)


def _trained(learner: Learner) -> dict[str, torch.Tensor]:
    state = {f"policy.{k}": v for k, v in learner.model.state_dict().items()}
    state.update({f"critic.{k}": v for k, v in learner._critic_module().state_dict().items()})
    return {k: learner.strategy.local(v).detach().clone() for k, v in state.items()}


# the separate critic model (a second tiny transformer) with the integration tests
@pytest.mark.parametrize(
    "separate",
    [False, pytest.param(True, marks=pytest.mark.integration)],
    ids=["value_head", "critic_model"],
)
def test_fsdp_checkpoints_the_critic_and_resumes_it_either_way(
    tmp_path: Path, fsdp_group: None, separate: bool
) -> None:
    with one_torch_thread():
        groups = make_groups(tiny_llama(seed=0), n_groups=2, seed=1)
        sharded = _learner("fsdp", 0, separate)
        sharded.step(groups)
        saved = sharded.save_checkpoint(tmp_path / "fsdp")
        meta = json.loads((saved / "learner.json").read_text())
        assert meta["critic"] is True and (saved / "critic.safetensors").is_file()
        after = sharded.step(groups)

        # sharded -> sharded (DCP), and sharded -> one whole learner (critic file +
        # AdamW by name): each takes the same next step
        again = _learner("fsdp", 1, separate)
        again.load_checkpoint(saved)
        whole = _learner("ddp", 1, separate)
        whole.load_checkpoint(saved)
        for other in (again, whole):
            nxt = other.step(groups)
            assert nxt["loss/total"] == pytest.approx(after["loss/total"], rel=1e-4, abs=1e-6)
            assert nxt["loss/value"] == pytest.approx(after["loss/value"], rel=1e-4, abs=1e-6)
        expected = _trained(sharded)
        for other in (again, whole):
            for name, w in _trained(other).items():
                torch.testing.assert_close(w, expected[name], rtol=1e-4, atol=2e-5, msg=name)

        # whole -> sharded: the critic from critic.safetensors, AdamW mapped to names
        back = whole.save_checkpoint(tmp_path / "whole")
        resharded = _learner("fsdp", 2, separate)
        resharded.load_checkpoint(back)
        ref, nxt = whole.step(groups), resharded.step(groups)
        assert nxt["loss/total"] == pytest.approx(ref["loss/total"], rel=1e-4, abs=1e-6)
