"""One rank of the learner group in the distributed tests (tests/learner/test_distributed.py).

    python -m tests.learner.distributed_worker RANK WORLD_SIZE ADDRESS OUT_DIR CASE[,CASE]

Trains the tiny model for 3 steps under each named case of :data:`CASES`, in one process
group, and rank 0 writes each case's full weights and metrics to ``OUT_DIR/<case>.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from agentrl.learner import Learner
from agentrl.learner.distributed import init_rank_group, leave_rank_group
from agentrl.models import tiny_llama
from agentrl.run.settings import resolve
from tests.learner.conftest import make_cfg, make_groups, one_torch_thread

STEPS = 3
# case -> config sections: each strategy with a different loss denominator
CASES: dict[str, dict[str, Any]] = {
    "ddp": {
        "learner": {"parallel": "ddp", "minibatches": 2},
        "algorithm": {"agg": "token-mean"},
    },
    "fsdp": {
        "learner": {"parallel": "fsdp", "ppo_epochs": 2},
        "algorithm": {"agg": "seq-mean-token-sum-norm", "off_policy": "tis"},
    },
    # PPO with GAE: the value head sharded and trained beside the policy, its values from
    # the split no-grad pass (the policy's update depends on them from step 2 on)
    "fsdp_critic": {
        "learner": {"parallel": "fsdp"},
        "algorithm": {"advantage": "gae", "critic": True, "lam": 0.95, "vf_coef": 0.5},
    },
    # algorithm.ref_refresh_every: each rank copies its own shards of the policy into the
    # sharded reference; a wrong copy puts a KL gradient where one process has none
    "fsdp_ref_refresh": {
        "learner": {"parallel": "fsdp", "ppo_epochs": 2},
        "algorithm": {"kl": "k3", "kl_coef": 0.5, "ref_refresh_every": 1},
    },
}


def train(case: str, world_size: int) -> tuple[dict[str, torch.Tensor], list[dict[str, float]]]:
    """3 steps of `case` on this rank; the full weights (rank 0) and each step's metrics."""
    sections = {k: dict(v) for k, v in CASES[case].items()}
    sections["learner"].update(world_size=world_size, fused_logprobs="off")
    if world_size == 1:
        sections["learner"]["parallel"] = "ddp"  # the single-process reference
    cfg = make_cfg(**sections)
    model = tiny_llama(seed=0)
    groups = make_groups(model, n_groups=3, group_size=4, seed=1)  # 3 groups on 2 ranks
    learner = Learner(model, None, resolve(cfg).learner)
    metrics = [learner.step(groups) for _ in range(STEPS)]
    weights = learner.strategy.full_state(learner.model, learner.sampler_weights())
    return {k: v.detach().float().cpu().clone() for k, v in weights.items()}, metrics


def main() -> None:
    rank, world_size, address, out, cases = sys.argv[1:6]
    init_rank_group(int(rank), int(world_size), address, device=torch.device("cpu"), timeout_s=120)
    with one_torch_thread():
        for case in cases.split(","):
            weights, metrics = train(case, int(world_size))
            if int(rank) == 0:
                torch.save({"weights": weights, "metrics": metrics}, Path(out) / f"{case}.pt")
    leave_rank_group()


if __name__ == "__main__":
    main()
