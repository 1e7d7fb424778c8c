"""Gateway cost: an agent program through the OpenAI API vs the built-in episode runner.

    .venv/bin/python benchmarks/gateway.py [--model smollm2-135m-instruct] [--quick]

One hf sampler, one set of tasks, the same two-turn conversation (question, answer,
"Check your answer.", answer) produced two ways:

(1) built-in: an Environment driven by the episode runner (no HTTP);
(2) gateway: ``env.name: agent`` with an entrypoint that makes the same two calls with the
    official ``openai`` client through the run's gateway (HTTP, JSON, recording).

Reports trajectory tokens/s of both (the best of ``--repeats`` alternating runs; target
gateway >= 0.85x built-in) and the latency the gateway adds to one call: the client's
wall time of ``chat.completions.create`` minus the sampler's ``generate`` time, one call
at a time, p50 and p99. Prints a table and writes benchmarks/results/gateway[_MODEL].json;
the machine's load average is recorded (on a shared box every number moves with it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.envs.base import AssistantTurn, Environment, Message, StepResult
from agentrl.run.settings import resolve
from agentrl.samplers.base import Generation, Sampler, SamplingParams

RESULTS = Path(__file__).resolve().parent / "results"
SYSTEM = "You are a careful assistant. Answer briefly."
FOLLOW_UP = "Check your answer."
CALL_TIMES: list[float] = []  # client-side wall time of each gateway call


class TwoTurnEnv(Environment):
    """The built-in twin of :func:`two_turn_agent`."""

    name = "bench_two_turn"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.turn = 0

    def tasks(self, split: str = "train", seed: int = 0):
        for i in range(10_000):
            yield {"id": f"q{i}", "question": f"What is {i} plus {i % 7}?"}

    async def reset(self, task: dict[str, Any]) -> list[Message]:
        self.turn = 0
        return [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": task["question"]},
        ]

    async def step(self, turn: AssistantTurn) -> StepResult:
        self.turn += 1
        if self.turn >= 2:
            return StepResult(outcome=float(len(turn.token_ids) % 2), done=True)
        return StepResult(observations=[{"role": "user", "content": FOLLOW_UP}])


async def two_turn_agent(client: Any, task: dict[str, Any]) -> float:
    """The same conversation as an agent program (plain openai client)."""
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": task["question"]},
    ]
    content = ""
    for turn in range(2):
        t0 = time.perf_counter()
        r = await client.chat.completions.create(model="agentrl", messages=messages)
        CALL_TIMES.append(time.perf_counter() - t0)
        content = r.choices[0].message.content or ""
        messages.append(r.choices[0].message.model_dump(exclude_none=True))
        if turn == 0:
            messages.append({"role": "user", "content": FOLLOW_UP})
    return float(len(content) % 2)


class TimedSampler(Sampler):
    """The real sampler, with the wall time of every generate call kept."""

    backend = "timed"

    def __init__(self, inner: Sampler) -> None:
        self.inner = inner
        self.times: list[float] = []

    version = property(lambda self: self.inner.version)  # type: ignore[assignment]
    tokenizer = property(lambda self: self.inner.tokenizer)
    context_length = property(lambda self: self.inner.context_length)  # type: ignore[assignment]
    vocab_size = property(lambda self: self.inner.vocab_size)  # type: ignore[assignment]

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        t0 = time.perf_counter()
        gen = await self.inner.generate(prompt_ids, params)
        self.times.append(time.perf_counter() - t0)
        return gen

    async def update_weights(self, weights: Any, version: int) -> None:
        await self.inner.update_weights(weights, version)

    async def close(self) -> None:
        await self.inner.close()


def _config(model: str, max_new_tokens: int, group_size: int, concurrency: int) -> Any:
    from agentrl.config import config_from_dict

    return config_from_dict(
        {
            "model": {"name": model},
            "sampler": {"max_new_tokens": max_new_tokens, "max_batch_size": 64},
            "env": {
                "name": "agent",
                "options": {"entrypoint": "benchmarks.gateway:two_turn_agent", "tasks": [{}]},
            },
            "rollout": {
                "group_size": group_size,
                "concurrency": concurrency,
                "max_tokens": 4 * max_new_tokens + 256,
            },
        }
    )


async def _produce(engine: Any, n_groups: int) -> tuple[int, int]:
    """(trajectory tokens, failed episodes) of `n_groups` groups."""
    groups = await engine.collect(n_groups)
    trajs = [t for g in groups for t in g.trajectories]
    bad = sum(1 for t in trajs if t.status == "infra_error")
    return sum(t.num_tokens for t in trajs), bad


def percentile(xs: Sequence[float], q: float) -> float:
    from agentrl.rollout.summary import percentile as p

    return p(list(xs), q)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    import benchmarks.gateway as bench  # the module the entrypoint runs in (not __main__)
    from agentrl.envs.agent import AgentEnv
    from agentrl.resources import ResourceScope
    from agentrl.rollout.tasks import TaskCursor
    from agentrl.run.components import build_engine, build_sampler

    cfg = _config(args.model, args.max_new_tokens, args.group_size, args.concurrency)
    sampler = TimedSampler(build_sampler(resolve(cfg).sampler))
    builtin_env = TwoTurnEnv()
    tasks = list(builtin_env.tasks())
    agent_env = AgentEnv(entrypoint="benchmarks.gateway:two_turn_agent", tasks=tasks)
    runs: dict[str, list[float]] = {"builtin": [], "gateway": []}
    tokens: dict[str, int] = {}
    scope = ResourceScope("bench")
    try:
        with scope.active():
            # warm-up: the first forward passes and the gateway's start
            for env in (builtin_env, agent_env):
                engine = build_engine(cfg, env, sampler)
                engine.cursor = TaskCursor.over(tasks[:2])
                await engine.collect(2)
            for rep in range(args.repeats):
                for name, env in (("builtin", builtin_env), ("gateway", agent_env)):
                    engine = build_engine(cfg, env, sampler)
                    start = 100 + rep * args.groups
                    engine.cursor = TaskCursor.over(tasks[start : start + args.groups])
                    t0 = time.perf_counter()
                    n_tokens, bad = await _produce(engine, args.groups)
                    wall = time.perf_counter() - t0
                    if bad:
                        raise RuntimeError(f"{bad} {name} episodes failed")
                    runs[name].append(n_tokens / wall)
                    tokens[name] = n_tokens
                    print(f"  {name:8s} rep {rep}: {n_tokens} tokens in {wall:.2f}s", flush=True)
            # added latency: one call at a time, client wall time minus generate time
            lat_cfg = _config(args.model, args.max_new_tokens, 1, 1)
            engine = build_engine(lat_cfg, agent_env, sampler)
            engine.cursor = TaskCursor.over(tasks[5000 : 5000 + args.latency_episodes])
            bench.CALL_TIMES.clear()
            sampler.times.clear()
            await engine.collect(args.latency_episodes)
            added = [c - g for c, g in zip(bench.CALL_TIMES, sampler.times, strict=True)]
    finally:
        await scope.aclose()
        await sampler.close()
    best = {name: max(v) for name, v in runs.items()}
    return {
        "model": args.model,
        "max_new_tokens": args.max_new_tokens,
        "groups": args.groups,
        "group_size": args.group_size,
        "concurrency": args.concurrency,
        "repeats": args.repeats,
        "builtin_tokens_per_s": best["builtin"],
        "gateway_tokens_per_s": best["gateway"],
        "ratio": best["gateway"] / best["builtin"],
        "runs_tokens_per_s": runs,
        "trajectory_tokens": tokens,
        "latency_calls": len(added),
        "added_latency_p50_ms": 1000 * percentile(added, 50),
        "added_latency_p99_ms": 1000 * percentile(added, 99),
        "generate_p50_ms": 1000 * percentile(sampler.times, 50),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_1m": os.getloadavg()[0],
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--latency-episodes", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="fewer groups and calls")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.groups, args.repeats, args.latency_episodes = 4, 1, 10
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 2)))
    result = anyio.run(measure, args)

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"gateway vs built-in runner ({args.model})")
    table.add_column("path")
    table.add_column("trajectory tokens/s", justify="right")
    table.add_column("ratio", justify="right")
    table.add_row("built-in episode runner", f"{result['builtin_tokens_per_s']:.0f}", "1.00")
    table.add_row(
        "gateway + openai client",
        f"{result['gateway_tokens_per_s']:.0f}",
        f"{result['ratio']:.2f}",
    )
    Console().print(table)
    print(
        f"added latency per call ({result['latency_calls']} calls, one at a time): "
        f"p50 {result['added_latency_p50_ms']:.1f} ms, p99 {result['added_latency_p99_ms']:.1f} ms "
        f"(generate p50 {result['generate_p50_ms']:.1f} ms)"
    )
    suffix = "" if args.model == "smollm2-135m-instruct" else f"_{args.model}"
    out = args.out or RESULTS / f"gateway{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
