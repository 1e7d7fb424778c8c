"""One rank of the 2-rank DPO test (tests/preference/test_ranks.py).

    python -m tests.preference.ranks_worker RANK WORLD_SIZE ADDRESS DATA RUN_DIR

Joins the gloo group and trains through :func:`agentrl.preference.run.train_preference`,
the entry ``agentrl dpo`` calls, with ``learner.parallel=fsdp``.
"""

from __future__ import annotations

import sys

import torch

from agentrl.config import load_config
from agentrl.learner.distributed import init_rank_group
from agentrl.preference.run import train_preference
from tests.learner.conftest import one_torch_thread

# 12 pairs, 4 a step, nothing held out: 3 steps; micro-batches of 2 pairs (4 sequences)
SETTINGS = [
    "model.name=tiny-llama",
    "learner.fused_logprobs=off",
    "learner.bf16=off",  # float32 on every CPU kind: the ranks differ only in sum order
    "learner.lr=5e-4",
    "learner.micro_batch_size=4",
    "preference.batch_size=4",
    "preference.eval_fraction=0",
]


def config(world_size: int, parallel: str) -> object:
    return load_config(
        overrides=[*SETTINGS, f"learner.world_size={world_size}", f"learner.parallel={parallel}"]
    )


def main() -> None:
    rank, world_size, address, data, run_dir = sys.argv[1:6]
    init_rank_group(int(rank), int(world_size), address, device=torch.device("cpu"), timeout_s=120)
    with one_torch_thread():
        train_preference(data, run_dir, cfg=config(int(world_size), "fsdp"), log=lambda _: None)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
