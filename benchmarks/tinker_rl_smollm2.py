"""tinker-cookbook's RL loop (``tinker_cookbook.rl.train``), unchanged, on SmolLM2-135M-Instruct
behind `agentrl serve --tinker` on CPU: one-digit additions, reward 1 when the last number
in the reply is the sum.

    nice -n 10 python benchmarks/tinker_rl_smollm2.py --steps 15

The cookbook's ProblemEnv (format term off) with its qwen3_instruct renderer (ChatML, as
SmolLM2-Instruct was trained), groups of 8, importance-sampling loss, LoRA rank 16.
Writes benchmarks/results/tinker_rl_smollm2.json: the mean reward of every step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "tinker_rl_smollm2.json"
MODEL = "smollm2-135m-instruct"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--groups", type=int, default=4, help="problems per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-4)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TINKER_API_KEY", "tml-local")

    import chz
    import torch
    from tinker_cookbook import renderers
    from tinker_cookbook.rl import train
    from tinker_cookbook.rl.problem_env import ProblemEnv, ProblemGroupBuilder
    from tinker_cookbook.rl.types import RLDataset, RLDatasetBuilder
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    from agentrl.models import resolve_model_dir
    from agentrl.run.tinker import open_server

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    state = Path(tempfile.mkdtemp(prefix="tinker-rl-"))
    # the cookbook loads the tokenizer by the model's name: serve the converted folder
    model_name = str(resolve_model_dir(MODEL))
    server = open_server(model_name, state)

    class Addition(ProblemEnv):
        def __init__(self, renderer: Any, a: int, b: int) -> None:
            super().__init__(renderer, format_coef=0.0)
            self.a, self.b = a, b

        def get_question(self) -> str:
            return f"What is {self.a} + {self.b}? Answer with just the number."

        def check_answer(self, sample_str: str) -> bool:
            numbers = re.findall(r"-?\d+", sample_str)  # the last number is the answer
            return bool(numbers) and numbers[-1] == str(self.a + self.b)

        def check_format(self, sample_str: str) -> bool:
            return True

        def get_reference_answer(self) -> str:
            return str(self.a + self.b)

    renderer = renderers.get_renderer("qwen3_instruct", get_tokenizer(model_name))

    class Problems(RLDataset):
        def get_batch(self, index: int) -> list[Any]:
            rng = random.Random(index)
            out = []
            for _ in range(args.groups):
                a, b = rng.randint(1, 9), rng.randint(1, 9)
                out.append(
                    ProblemGroupBuilder(
                        env_thunk=lambda a=a, b=b: Addition(renderer, a, b),
                        num_envs=args.group_size,
                        dataset_name="addition",
                    )
                )
            return out

        def __len__(self) -> int:
            return args.steps

    @chz.chz
    class Builder(RLDatasetBuilder):
        async def __call__(self) -> tuple[RLDataset, None]:
            return Problems(), None

    log_path = state / "rl"
    config = train.Config(
        learning_rate=args.lr,
        dataset_builder=Builder(),
        model_name=model_name,
        recipe_name="agentrl_tinker_smollm2",
        renderer_name="qwen3_instruct",
        max_tokens=12,
        log_path=str(log_path),
        eval_every=0,
        save_every=0,
        lora_rank=16,
        base_url=server.url,
        num_groups_to_log=0,
        rollout_json_export=False,
    )
    start = time.perf_counter()
    asyncio.run(train.main(config))
    elapsed = time.perf_counter() - start
    rewards = [
        m["env/all/reward/total"]
        for m in map(json.loads, (log_path / "metrics.jsonl").read_text().splitlines())
        if "env/all/reward/total" in m
    ]
    server.close()
    k = max(1, len(rewards) // 3)
    result = {
        "model": MODEL,
        "steps": len(rewards),
        "samples_per_step": args.groups * args.group_size,
        "learning_rate": args.lr,
        "reward_per_step": [round(r, 4) for r in rewards],
        "first_third_mean": round(sum(rewards[:k]) / k, 4),
        "last_third_mean": round(sum(rewards[-k:]) / k, 4),
        "minutes": round(elapsed / 60, 1),
    }
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
