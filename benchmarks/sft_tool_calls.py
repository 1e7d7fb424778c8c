"""Does a short SFT teach SmolLM2-135M the Hermes ``<tool_call>`` format?

    python benchmarks/sft_tool_calls.py                        # 160 demos, 1 epoch, 64 samples
    python benchmarks/sft_tool_calls.py --demos 300 --epochs 2 --samples 128  # longer

A demonstration is about 410 tokens (the python tool's schema makes most of the prompt);
the defaults took 18 minutes on 2 CPU cores shared with other jobs (SFT 762 s at about
80 tokens/s forward and backward, the two sampling passes 292 s and 29 s).

1. Demonstrations are generated from code_math's chain_sum tasks in the run's own format
   (``call_format: tool_call``, no few-shot turns): system prompt with the python tool's
   schema, the question, an assistant ``<tool_call>`` running the expression, the tool's
   output, and ``\\boxed{answer}``.
2. Before and after ``agentrl sft`` on them, the model answers held-out tasks (eval split,
   temperature 1, the hf sampler): a first turn is *well formed* when it holds a
   ``<tool_call>`` block whose JSON is ``{"name": "python", "arguments": {"code": str}}``.

Prints a table and writes benchmarks/results/sft_tool_calls.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "sft_tool_calls.json"
ENV = {"generators": ["chain_sum"], "call_format": "tool_call", "fewshot": "none", "size": 2000}
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def well_formed(text: str) -> bool:
    block = _BLOCK.search(text)
    if block is None:
        return False
    try:
        call = json.loads(block.group(1))
    except json.JSONDecodeError:
        return False
    args = call.get("arguments") if isinstance(call, dict) else None
    return (
        call.get("name") == "python"
        and isinstance(args, dict)
        and isinstance(args.get("code"), str)
    )


def make_demos(env, n: int, path: Path) -> Path:
    import anyio

    rows = []
    for task in env.tasks(split="train", seed=0):
        if len(rows) == n:
            break
        expression = task["question"].rsplit(":", 1)[-1].strip().rstrip("=").strip()
        messages = anyio.run(env.spawn().reset, task)
        code = f"print({expression})"
        rows.append(
            {
                "messages": [
                    *messages,
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"function": {"name": "python", "arguments": {"code": code}}}
                        ],
                    },
                    {"role": "tool", "name": "python", "content": task["answer"]},
                    {"role": "assistant", "content": f"\\boxed{{{task['answer']}}}"},
                ],
                "tools": env.tool_schemas(),
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tool_call_rate(model_name: str, env, samples: int, seed: int) -> tuple[float, list[str]]:
    """Share of well-formed first turns over `samples` held-out prompts (temperature 1)."""
    import anyio

    from agentrl.chat import ChatRenderer
    from agentrl.samplers import SamplingParams, create_sampler

    sampler = create_sampler("hf", model=model_name, dtype="float32", max_batch_size=32)
    renderer = ChatRenderer(sampler.tokenizer, tools=env.tool_schemas())
    tasks = [t for _, t in zip(range(samples), env.tasks(split="eval", seed=seed), strict=False)]
    params = SamplingParams(
        temperature=1.0, max_new_tokens=96, stop_token_ids=renderer.stop_token_ids
    )

    async def run() -> list[str]:
        texts: list[str] = [""] * len(tasks)
        async with anyio.create_task_group() as tg:
            for i, task in enumerate(tasks):

                async def one(i: int = i, task: dict = task) -> None:
                    ids = renderer.prompt_ids(await env.spawn().reset(task))
                    gen = await sampler.generate(ids, params.with_(seed=seed * 1000 + i))
                    texts[i] = renderer.decode(gen.token_ids)

                tg.start_soon(one)
        await sampler.close()
        return texts

    texts = anyio.run(run)
    return sum(map(well_formed, texts)) / len(texts), texts


def main() -> None:
    from agentrl.config import load_config
    from agentrl.envs import make_env
    from agentrl.run.settings import sft_settings
    from agentrl.training.sft import train_sft

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--demos", type=int, default=160)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--work", type=Path, default=Path("/tmp/agentrl_sft_bench"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    env = make_env("code_math", **ENV)
    load = [os.getloadavg()[0]]
    t0 = time.time()
    before, before_texts = tool_call_rate(args.model, env, args.samples, seed=1)
    before_seconds = time.time() - t0
    print(f"before SFT: {before:.1%} well-formed tool calls ({before_seconds:.0f}s)", flush=True)
    demos = make_demos(env, args.demos, args.work / "demos.jsonl")
    cfg = load_config(
        overrides=[f"model.name={args.model}", "env.name=code_math"]
        + [f"env.options.{k}={json.dumps(v)}" for k, v in ENV.items()]
    )
    t1 = time.time()
    settings = sft_settings(
        cfg, epochs=args.epochs, lr=args.lr, batch_size=args.batch_size, eval_fraction=0.1
    )
    report = train_sft(demos, args.work / "sft", settings)
    sft_seconds = time.time() - t1
    load.append(os.getloadavg()[0])
    print(
        f"SFT: {report.trained_tokens} assistant tokens per epoch, {sft_seconds:.0f}s", flush=True
    )
    t2 = time.time()
    after, after_texts = tool_call_rate(str(args.work / "sft"), env, args.samples, seed=1)
    after_seconds = time.time() - t2
    load.append(os.getloadavg()[0])
    rows = {
        "model": args.model,
        "demos": args.demos,
        "epochs": args.epochs,
        "lr": args.lr,
        "batch_size": args.batch_size,
        "sft_examples": report.examples,
        "samples": args.samples,
        "env": ENV,
        "rate_before": before,
        "rate_after": after,
        "before_seconds": before_seconds,
        "sft_seconds": sft_seconds,
        "after_seconds": after_seconds,
        "sft_out": str(args.work / "sft"),
        "sft_eval_loss_before": report.eval_loss_before,
        "sft_eval_loss_after": report.eval_loss,
        "examples_before": before_texts[:3],
        "examples_after": after_texts[:3],
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "load_avg_1m": load,
    }
    print(
        f"\n| | well-formed <tool_call> |\n|---|---|\n| before SFT | {before:.1%} |\n| after SFT ({args.demos} demos, {args.epochs} epochs) | {after:.1%} |"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=1))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
