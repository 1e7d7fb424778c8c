"""Measure how often a model solves an environment's tasks before training.

    python -m agentrl.envs.baseline code_math --episodes 32 --temperature 1.0
    python -m agentrl.envs.baseline code_math --set fewshot=messages --json out.json

A small batched loop over ``transformers.generate`` (no sampler, no training, no token
accounting): every episode gets a turn, the environment answers, up to ``--turns`` turns.
The full-system path is ``agentrl rollout CONFIG``; this one exists to tune prompts and
difficulty quickly on a CPU.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import anyio


def _parse_sets(items: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items:
        key, _, raw = item.partition("=")
        try:
            options[key] = json.loads(raw)
        except json.JSONDecodeError:
            options[key] = raw
    return options


async def measure(
    env_name: str,
    options: dict[str, Any],
    episodes: int,
    turns: int,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    model_name: str = "smollm2-135m-instruct",
    stop: list[str] | None = None,
    env_stop: bool = True,
) -> dict[str, Any]:
    import torch

    from agentrl.chat import ChatRenderer
    from agentrl.envs import AssistantTurn, make_env
    from agentrl.models import load_model

    torch.manual_seed(seed)
    model, tok = load_model(model_name, dtype="float32")
    proto = make_env(env_name, **options)
    tasks = [t for _, t in zip(range(episodes), proto.tasks(seed=seed), strict=False)]
    envs = [proto.spawn() for _ in tasks]
    if env_stop:  # stop where the rollout stops: the environment's stop strings too
        stop = list(dict.fromkeys([*(stop or []), *proto.stop_strings()]))
    renderer = ChatRenderer(tok, tools=proto.tool_schemas())
    end_id = tok.convert_tokens_to_ids("<|im_end|>")
    history = [await env.reset(task) for env, task in zip(envs, tasks, strict=True)]
    rewards: list[float | None] = [None] * len(tasks)
    calls = [0] * len(tasks)
    transcripts: list[list[str]] = [[] for _ in tasks]
    t0 = time.perf_counter()
    try:
        for _ in range(turns):
            live = [i for i, r in enumerate(rewards) if r is None]
            if not live:
                break
            prompts = [renderer.prompt_ids(history[i]) for i in live]
            width = max(map(len, prompts))
            pad = tok.pad_token_id if tok.pad_token_id is not None else 0
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
            with torch.no_grad():
                out = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=max_new_tokens,
                    do_sample=temperature > 0,
                    temperature=temperature if temperature > 0 else None,
                    top_p=None,
                    top_k=None,
                    eos_token_id=end_id,
                    pad_token_id=pad,
                    **({"stop_strings": stop, "tokenizer": tok} if stop else {}),
                )
            for row, i in enumerate(live):
                text = tok.decode(out[row, width:], skip_special_tokens=True).strip()
                transcripts[i].append(text)
                result = await envs[i].step(AssistantTurn(text=text, token_ids=[]))
                history[i].append({"role": "assistant", "content": text})
                calls[i] += len(result.info.get("tool_calls", []))
                if result.done:
                    rewards[i] = float(result.outcome or 0.0)
                else:
                    history[i].extend(result.observations)
    finally:
        for env in envs:
            await env.close()
    final = [r if r is not None else 0.0 for r in rewards]
    solved = sum(r >= 1.0 for r in final)
    return {
        "env": env_name,
        "options": options,
        "model": model_name,
        "episodes": len(tasks),
        "temperature": temperature,
        "max_new_tokens": max_new_tokens,
        "turns": turns,
        "stop": stop or [],
        "success_rate": solved / max(len(tasks), 1),
        "used_tool_rate": sum(c > 0 for c in calls) / max(len(tasks), 1),
        "answered_rate": sum(r is not None for r in rewards) / max(len(tasks), 1),
        "mean_reward": sum(final) / max(len(final), 1),
        "seconds": round(time.perf_counter() - t0, 1),
        "examples": [
            {"question": t["question"], "answer": t["answer"], "turns": tr, "reward": r}
            for t, tr, r in zip(tasks[:6], transcripts[:6], final[:6], strict=False)
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("env", nargs="?", default="code_math")
    ap.add_argument("--set", action="append", default=[], help="env option key=value (JSON)")
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    ap.add_argument("--no-env-stop", action="store_true", help="ignore the env's stop strings")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args()
    result = anyio.run(
        measure,
        args.env,
        _parse_sets(args.set),
        args.episodes,
        args.turns,
        args.temperature,
        args.max_new_tokens,
        args.seed,
        args.model,
        args.stop,
        not args.no_env_stop,
    )
    summary = {k: v for k, v in result.items() if k != "examples"}
    print(json.dumps(summary, indent=2))
    for ex in result["examples"]:
        print(json.dumps(ex)[:400])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
