"""Adaptive-KL PPO on 2 ranks (gloo, CPU): every rank adapts beta from the KL seen on all of
them, so ranks whose own rows saw different KLs keep one beta (before: each rank its own)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from agentrl.learner.distributed import Ranks, init_rank_group, leave_rank_group
from agentrl.learner.objective import Objective
from agentrl.models import tiny_llama
from agentrl.run.settings import resolve
from agentrl.types import Batch
from tests.learner.conftest import make_cfg, make_groups
from tests.learner.ranks import free_port, run_ranks

SHIFT = 0.5  # rank 1's policy change (log-prob shift on every trained token); rank 0's is 0


def _objective(target: float) -> Objective:
    cfg = make_cfg(
        algorithm={
            "policy_loss": "ppo_adaptive_kl",
            "options": {"kl_beta": 1.0, "kl_target": target},
        }
    )
    return Objective(resolve(cfg).objective.algorithm, attribution="soft", norm_length=64)


def _see_kl(obj: Objective, batch: Batch, shift: float) -> None:
    """One micro-batch's loss whose policy moved every trained log-prob by `shift`."""
    mask, old = batch.loss_mask, batch.behavior_logprobs
    obj.loss(
        old + shift * mask, None, None, mask=mask, old_logprobs=old, behavior_logprobs=old,
        advantages=torch.zeros_like(mask), ref_logprobs=None, old_values=None,
        returns=None, denominator=float(mask.sum()),
    )  # fmt: skip


def _rank(rank: int, address: str, out: str) -> None:
    """One rank (a process of its own: ``python -m tests.learner.test_adaptive_kl_ranks``)."""
    torch.set_num_threads(1)
    init_rank_group(rank, 2, address, device=torch.device("cpu"), timeout_s=60)
    batch = Batch.from_groups(make_groups(tiny_llama(seed=0), n_groups=2, group_size=2, seed=1))
    # the KL of rank 1's micro-batch alone (same on both ranks: a local computation)
    probe = _objective(1.0)
    _see_kl(probe, batch, SHIFT)
    probe.end_step()
    k1 = probe.state_dict()["adaptive_kl"]["pending_kl"]
    # target = the mean over both ranks (0 and k1): within [target/1.5, 1.5 target], beta
    # stays; rank 0 alone (KL 0) would halve it, rank 1 alone (KL 2 x target) double it
    obj = _objective(k1 / 2)
    obj.advantages(batch, batch.rewards, None)
    _see_kl(obj, batch, 0.0 if rank == 0 else SHIFT)
    ranks = Ranks.from_settings(resolve(make_cfg(learner={"world_size": 2})).learner.train)
    obj.end_step(lambda seen: ranks.sum_(seen, torch.device("cpu")))
    obj.advantages(batch, batch.rewards, None)
    torch.save(
        {"k1": k1, "beta": obj.loss_options["kl_beta"], "state": obj.state_dict()},
        Path(out) / f"rank{rank}.pt",
    )
    leave_rank_group()


@pytest.mark.slow  # two torch.distributed processes
def test_ranks_adapt_one_beta_from_the_kl_of_all_ranks(tmp_path: Path) -> None:
    address = f"tcp://127.0.0.1:{free_port()}"
    run_ranks("tests.learner.test_adaptive_kl_ranks", 2, address, str(tmp_path))
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert r0["k1"] > 0
    assert r0["beta"] == r1["beta"] == 1.0
    assert r0["state"] == r1["state"]


def test_a_single_process_adapts_from_its_own_kl() -> None:
    """The same objective without ranks: rank 1's KL alone is twice the target: beta doubles."""
    batch = Batch.from_groups(make_groups(tiny_llama(seed=0), n_groups=2, group_size=2, seed=1))
    probe = _objective(1.0)
    _see_kl(probe, batch, SHIFT)
    probe.end_step()
    obj = _objective(probe.state_dict()["adaptive_kl"]["pending_kl"] / 2)
    obj.advantages(batch, batch.rewards, None)
    _see_kl(obj, batch, SHIFT)
    obj.end_step()
    obj.advantages(batch, batch.rewards, None)
    assert obj.loss_options["kl_beta"] == 2.0


if __name__ == "__main__":
    _rank(int(sys.argv[1]), sys.argv[2], sys.argv[3])
