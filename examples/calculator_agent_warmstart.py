"""Teach SmolLM2-135M the calculator agent's tool call by SFT, then train the agent with RL.

    python examples/calculator_agent_warmstart.py                       # SmolLM2-135M, ~31 min on 2 busy CPUs
    python examples/calculator_agent_warmstart.py --tiny --demos 8 --steps 1   # the test model, seconds

examples/calculator_agent.py is a plain `openai` tool loop; through the gateway its
`calculate` tool reaches the model as Hermes ``<tool_call>`` JSON, which SmolLM2-135M almost
never writes on its own (0 tool calls in 384 episodes), so every GRPO group scores the same
and nothing trains. Three steps fix that:

1. **Demonstrations** in exactly the agent's message format: its SYSTEM prompt and TOOLS
   schema, a code_math basic_arithmetic question, an assistant call of ``calculate`` on the
   question's expression, the tool's result (computed by the agent's own ``calculate``), then
   ``\\boxed{result}``. Questions come from a different seed than the RL run's tasks.
2. **SFT**: ``agentrl sft demos.jsonl --config examples/calculator_agent.yaml``, so the demos
   are rendered with the chat template the gateway renders with, and the loss is on the
   assistant's tokens only.
3. **RL**: ``agentrl train examples/calculator_agent.yaml --set model.name=<sft folder>``,
   the agent program unchanged.

Prints the per-step table (reward, tool calls per episode, prefix breaks) and writes
``<work>/warmstart.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "calculator_agent.yaml"
sys.path.insert(0, str(REPO / "examples"))

import calculator_agent as agent  # noqa: E402  (SYSTEM, TOOLS, calculate: the agent's own)


def expression_of(question: str) -> str:
    """'Calculate -( -46 + 330 ).' -> '-( -46 + 330 )'"""
    return question.removeprefix("Calculate").strip().removesuffix(".").strip()


def demonstration(task: dict) -> dict | None:
    """The agent's conversation for one task, solved with one tool call; None when the
    agent's calculator does not give the task's answer (it then teaches nothing right)."""
    expression = expression_of(task["question"])
    result = agent.calculate(expression)
    if result != str(task["answer"]).strip():
        return None
    call_id = "call_0"
    return {
        "messages": [
            {"role": "system", "content": agent.SYSTEM},
            {"role": "user", "content": task["question"]},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "calculate", "arguments": {"expression": expression}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": result},
            {"role": "assistant", "content": f"\\boxed{{{result}}}"},
        ],
        "tools": agent.TOOLS,
    }


def write_demos(path: Path, n: int, seed: int = 1000) -> int:
    """`n` demonstrations from the task environment of the agent's config."""
    from agentrl.config import load_config
    from agentrl.envs import make_env

    task_env = load_config(CONFIG).env.options["task_env"]
    env = make_env(task_env["name"], **task_env.get("options", {}))
    rows = []
    for task in itertools.islice(env.tasks(split="train", seed=seed), 20 * n):
        row = demonstration(task)
        if row is not None:
            rows.append(row)
        if len(rows) == n:
            break
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def cli(*args: str, log: Path) -> None:
    """`agentrl ARGS` in a subprocess (its output also goes to `log`)."""
    cmd = [sys.executable, "-m", "agentrl.cli", *args]
    print("$ agentrl " + " ".join(args), flush=True)
    with log.open("a") as f:
        f.write("$ agentrl " + " ".join(args) + "\n")
        f.flush()
        proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            f.write(line)
        if proc.wait() != 0:
            raise SystemExit(f"agentrl {args[0]} failed (exit {proc.returncode}); see {log}")


def main(argv: list[str] | None = None) -> dict:
    from agentrl.run.plotting import learning_summary, read_steps

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tiny", action="store_true", help="the random test model (seconds)")
    parser.add_argument("--demos", type=int, default=160)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10, help="RL steps")
    parser.add_argument("--time-limit", type=float, default=900, help="RL seconds at most")
    parser.add_argument("--work", type=Path, default=Path("runs/calculator_warmstart"))
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"
    model = "tiny-llama" if args.tiny else args.model
    t0 = time.time()

    n = write_demos(work / "demos.jsonl", args.demos)
    print(f"{n} demonstrations -> {work / 'demos.jsonl'}", flush=True)
    sft_args = ["sft", str(work / "demos.jsonl"), "--config", str(CONFIG), "--model", model]
    sft_args += ["--out", str(work / "sft"), "--epochs", str(args.epochs), "--lr", str(args.lr)]
    sft_args += ["--batch-size", str(args.batch_size), "--eval-fraction", "0.1"]
    t1 = time.time()
    cli(*sft_args, log=log)
    sft_seconds = time.time() - t1

    run_dir = work / "rl"
    overrides = [
        f"model.name={work / 'sft'}",
        f"orchestrator.max_steps={args.steps}",
        f"orchestrator.time_limit_s={args.time_limit}",
        f"orchestrator.run_dir={run_dir}",
        "orchestrator.checkpoint_every=0",
        "logging.progress=false",
    ]
    if args.tiny:  # the random model scores 0 everywhere: no group would have mixed rewards
        overrides += ["model.dtype=float32", "algorithm.dynamic_sampling=false"]
    overrides += args.overrides
    train_args = ["train", str(CONFIG)] + [a for o in overrides for a in ("--set", o)]
    t2 = time.time()
    cli(*train_args, log=log)
    rl_seconds = time.time() - t2

    steps = read_steps(run_dir)
    keys = ("reward_mean", "tool_calls_per_episode", "gateway/prefix_breaks", "groups_finished")
    print("\n| step | reward | tool calls / episode | prefix breaks / group | groups finished |")
    print("|---|---|---|---|---|")
    for s in steps:
        cells = [f"{s[k]:.3f}" if isinstance(s.get(k), float) else "" for k in keys]
        print(f"| {s['step']} | " + " | ".join(cells) + " |")
    summary = learning_summary(steps)
    if summary:
        print(
            f"reward: first 3 steps {summary['first_k_reward']:.3f} -> last 3 steps "
            f"{summary['last_k_reward']:.3f} (gain {summary['gain']:+.3f})"
        )
    sft_record = json.loads((work / "sft" / "agentrl_export.json").read_text()).get("sft", {})
    out = {
        "model": model,
        "demos": n,
        "epochs": args.epochs,
        "lr": args.lr,
        "batch_size": args.batch_size,
        "sft": sft_record,
        "sft_seconds": sft_seconds,
        "rl_seconds": rl_seconds,
        "total_seconds": time.time() - t0,
        "load_avg_1m_end": os.getloadavg()[0],
        "summary": summary,
        "steps": [{k: s.get(k) for k in ("step", *keys, "batch/reward_mean")} for s in steps],
        "run_dir": str(run_dir),
    }
    (work / "warmstart.json").write_text(json.dumps(out, indent=1))
    print(f"wrote {work / 'warmstart.json'}")
    return out


if __name__ == "__main__":
    main()
