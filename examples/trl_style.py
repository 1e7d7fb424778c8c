"""GRPO on your own JSONL dataset with two reward functions, then an exported model folder.

    python examples/trl_style.py                    # SmolLM2-135M-Instruct, 20 steps
    python examples/trl_style.py --tiny --steps 1   # the random test model, seconds

What TRL's GRPOTrainer(model, reward_funcs=[...], train_dataset=...) does, as agentrl config:
tasks from a JSONL file (``data``), rewards as plain Python functions (``reward``), GRPO
(``algorithm``), and ``agentrl export`` at the end (a folder transformers and vLLM load).
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

HERE = Path(__file__).resolve()


# --- two reward functions: called with (task, completion[, trajectory]) ------------------


def correct(task: dict, completion: str) -> float:
    """1 when the last number in the answer is the task's answer (a column of the dataset)."""
    numbers = re.findall(r"-?\d+", completion)
    return float(bool(numbers) and numbers[-1] == task["answer"])


def concise(task: dict, completion: str, trajectory) -> float:
    """Shorter answers score higher: 1 at one token, 0 at 64 or more."""
    return max(0.0, 1.0 - trajectory.num_model_tokens / 64)


# --- the script ---------------------------------------------------------------------------


def write_dataset(path: Path, n: int = 200, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(n):
            a, b = rng.randint(1, 20), rng.randint(1, 20)
            f.write(
                json.dumps(
                    {"problem": f"What is {a} + {b}? Reply with the number.", "answer": str(a + b)}
                )
                + "\n"
            )
    return path


def main(argv: list[str] | None = None) -> dict:
    import anyio

    from agentrl.config import load_config
    from agentrl.run.export import export_checkpoint
    from agentrl.run.orchestrator import train
    from agentrl.run.plotting import read_steps

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/trl_style"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--tiny", action="store_true", help="the random test model (fast)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    data = write_dataset(args.out / "train.jsonl")
    overrides = [
        f"data.path={data}",
        "data.prompt=problem",
        f"reward.functions=[{HERE}:correct, {HERE}:concise]",
        "reward.weights=[1.0, 0.1]",
        "algorithm.advantage=grpo",
        "rollout.group_size=4",
        "rollout.max_turns=1",
        "learner.batch_groups=2",
        f"orchestrator.max_steps={args.steps}",
        "orchestrator.max_staleness=0",
        "orchestrator.checkpoint_every=0",  # the last step always checkpoints
        "logging.progress=false",
    ]
    if args.tiny:
        overrides += [
            "model.name=tiny-llama",
            "sampler.max_new_tokens=8",
            "learner.lr=1e-3",
            "learner.fused_logprobs=off",
            "orchestrator.learner_worker=thread",
        ]
    else:
        overrides += ["sampler.max_new_tokens=32", "learner.lr=1e-6"]
    cfg = load_config(overrides=overrides)
    run_dir = args.out / "run"
    anyio.run(train, cfg, run_dir)
    model_dir = export_checkpoint(run_dir, args.out / "model", overwrite=True)
    steps = read_steps(run_dir)
    print(
        f"trained {len(steps)} steps; reward {steps[0].get('reward_mean')} -> {steps[-1].get('reward_mean')}"
    )
    print(f"model: {model_dir} (AutoModelForCausalLM.from_pretrained loads it)")
    return {"run_dir": run_dir, "model_dir": model_dir, "steps": steps}


if __name__ == "__main__":
    main()
