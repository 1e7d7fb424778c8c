"""One rank of the 2-rank DPO test (tests/preference/test_ranks.py): the ``agentrl dpo``
command itself, in a process group set up as torchrun sets it up.

    python -m tests.preference.ranks_worker RANK WORLD_SIZE PORT DATA RUN_DIR
"""

from __future__ import annotations

import os
import sys

import torch

from agentrl.config import Config, load_config
from agentrl.learner.distributed import leave_rank_group

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


def config(world_size: int, parallel: str) -> Config:
    return load_config(overrides=[*SETTINGS, *rank_settings(world_size, parallel)])


def rank_settings(world_size: int, parallel: str) -> list[str]:
    return [f"learner.world_size={world_size}", f"learner.parallel={parallel}"]


def main() -> None:
    from agentrl.cli import app

    rank, world_size, port, data, run_dir = sys.argv[1:6]
    os.environ.update(RANK=rank, WORLD_SIZE=world_size, MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.set_num_threads(1)
    overrides = [*SETTINGS, *rank_settings(int(world_size), "fsdp")]
    args = ["dpo", data, "--run-dir", run_dir]
    app([*args, *(a for o in overrides for a in ("--set", o))], standalone_mode=False)
    leave_rank_group()


if __name__ == "__main__":
    main()
