"""Where a learner step synchronises with the host on CUDA (issue 38).

    AGENTRL_CACHE=.gpu-bundle/cache python scripts/gpu_syncs.py   # on the GPU machine

One step of 4 groups x 2 trajectories at micro_batch_size 1 under
torch.cuda.set_sync_debug_mode("warn"); each warning is counted by the innermost agentrl
frames of the Python stack it was raised from (benchmarks/results/gpu/2026-11-27-b/syncs.txt).
"""

import collections
import traceback
import warnings

import torch

from agentrl.config import config_from_dict
from agentrl.learner import Learner
from agentrl.models import load_tokenizer, tiny_llama
from agentrl.types import Segment, Trajectory
from agentrl.types import TrajectoryGroup as Group

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def groups(n):
    return [
        Group(
            task_id=str(g),
            group_id=str(g),
            trajectories=[
                Trajectory(
                    segments=[
                        Segment("prompt", [5 + g, 6, 7]),
                        Segment("model", [8, 9, 10], logprobs=[-1.0] * 3, versions=[0] * 3),
                    ],
                    reward=float(i % 2),
                    traj_id=f"{g}-{i}",
                )
                for i in range(2)
            ],
        )
        for g in range(n)
    ]


cfg = config_from_dict({"learner": {"device": DEV, "micro_batch_size": 1, "share_prompt": False}})
learner = Learner(tiny_llama(0), load_tokenizer("tiny-llama"), cfg)
learner.step(groups(4))
torch.cuda.synchronize()
where = collections.Counter()


def show(message, category, filename, lineno, file=None, line=None):
    st = [f for f in traceback.extract_stack()[:-1] if "agentrl" in f.filename]
    where[" <- ".join(f"{f.filename.split('agentrl/')[-1]}:{f.lineno}" for f in st[::-1][:3])] += 1


warnings.showwarning = show
torch.cuda.set_sync_debug_mode("warn")
with warnings.catch_warnings():
    warnings.simplefilter("always")
    warnings.showwarning = show
    learner.step(groups(4))
torch.cuda.set_sync_debug_mode(0)
for k, v in where.most_common():
    print(v, k)
