"""The classic RLHF pipeline: preference pairs -> a Bradley–Terry reward model -> PPO against it.

    python examples/reward_model.py                   # SmolLM2-135M-Instruct
    python examples/reward_model.py --tiny --steps 1  # the random test model, seconds

1. Preference pairs are made offline: for arithmetic questions, a correct answer is
   preferred to an incorrect one (``agentrl rm train`` reads the same JSONL).
2. The reward model is trained (held-out pairwise accuracy printed).
3. A policy is trained with PPO and a critic, scored by the reward model, with a per-token
   KL penalty to the reference policy folded into the reward (``algorithm.kl_in_reward``):
   actor, frozen reference, reward model and critic, as in the InstructGPT recipe.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def write_pairs(path: Path, n: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(n):
            a, b = rng.randint(1, 50), rng.randint(1, 50)
            wrong = a + b + rng.choice([-3, -2, -1, 1, 2, 3])
            row = {
                "prompt": f"What is {a} + {b}?",
                "chosen": f"{a} + {b} = {a + b}. The answer is {a + b}.",
                "rejected": f"{a} + {b} = {wrong}. The answer is {wrong}.",
            }
            f.write(json.dumps(row) + "\n")
    return path


def write_prompts(path: Path, n: int, seed: int = 1) -> Path:
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(n):
            a, b = rng.randint(1, 50), rng.randint(1, 50)
            f.write(json.dumps({"prompt": f"What is {a} + {b}?"}) + "\n")
    return path


def main(argv: list[str] | None = None) -> dict:
    import anyio

    from agentrl.config import Config, load_config
    from agentrl.rewards.bradley_terry import train_reward_model
    from agentrl.run.orchestrator import train
    from agentrl.run.plotting import read_steps
    from agentrl.run.settings import reward_model_training_settings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/reward_model"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--pairs", type=int, default=400)
    parser.add_argument("--tiny", action="store_true", help="the random test model (fast)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    model = "tiny-llama" if args.tiny else "smollm2-135m-instruct"

    pairs = write_pairs(args.out / "prefs.jsonl", args.pairs)
    settings = reward_model_training_settings(
        Config(),
        model=model,
        epochs=1 if args.tiny else 2,
        lr=1e-3 if args.tiny else 2e-5,
        max_length=128,
    )
    report = train_reward_model(pairs, args.out / "rm", settings)
    print(
        f"reward model: held-out pairwise accuracy {report.accuracy_before:.2f} -> {report.accuracy:.2f}"
    )

    overrides = [
        f"model.name={model}",
        f"data.path={write_prompts(args.out / 'prompts.jsonl', 200)}",
        f"reward.model={args.out / 'rm'}",
        "algorithm.advantage=gae",
        "algorithm.critic=true",
        "algorithm.kl=k1",
        "algorithm.kl_coef=0.05",
        "algorithm.kl_in_reward=true",
        "rollout.group_size=4",
        "rollout.max_turns=1",
        "learner.batch_groups=2",
        f"orchestrator.max_steps={args.steps}",
        "orchestrator.max_staleness=0",
        "orchestrator.checkpoint_every=0",
        "logging.progress=false",
    ]
    if args.tiny:
        overrides += [
            "sampler.max_new_tokens=8",
            "learner.lr=1e-3",
            "learner.fused_logprobs=off",
            "orchestrator.learner_worker=thread",
        ]
    else:
        overrides += ["sampler.max_new_tokens=32", "learner.lr=1e-6"]
    run_dir = args.out / "run"
    anyio.run(train, load_config(overrides=overrides), run_dir)
    steps = read_steps(run_dir)
    print(
        f"policy: {len(steps)} PPO steps; RM reward {steps[0].get('reward_mean')} -> {steps[-1].get('reward_mean')}"
    )
    return {"report": report, "run_dir": run_dir, "steps": steps}


if __name__ == "__main__":
    main()
