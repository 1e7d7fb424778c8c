"""Rollout engine speed: overhead over the raw sampler, and scaling with tool latency.

    .venv/bin/python benchmarks/rollout.py [--model smollm2-135m-instruct] [--quick]

In one run, on one hf sampler (continuous batching) and one model:

(1) overhead: with an instant tool, model tokens/s of whole multi-turn trajectories through
    the engine vs the sampler's raw tokens/s (the same number of concurrent callers
    calling ``generate`` back to back with the same per-turn length). Target >= 0.9x.
(2) tool latency: every tool call waits 200 ms (a stand-in for a remote search service);
    episodes/s at 1, 8, 32 and 64 concurrent actors. Speedup should track concurrency until
    the sampler saturates; the saturation point is where the speedup falls below half
    of the ideal (linear) speedup or stops growing.

Prints a table and writes benchmarks/results/rollout.json. The machine's load average is
recorded: on a shared box every number moves with it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from agentrl.envs.base import AssistantTurn, Environment, Message, StepResult
from agentrl.types import ToolCallRecord

RESULTS = Path(__file__).resolve().parent / "results"


class DelayToolEnv(Environment):
    """Every turn but the last gets one tool result after `delay_s` seconds."""

    name = "bench_delay"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.delay_s = float(options.get("delay_s", 0.0))
        self.tool_turns = int(options.get("tool_turns", 2))
        self.turn = 0

    def tasks(self, split: str = "train", seed: int = 0):
        i = 0
        while True:
            yield {"id": f"{seed}-{i}", "question": f"What is {i} times {i + 3}? Use the tool."}
            i += 1

    async def reset(self, task: dict[str, Any]) -> list[Message]:
        self.turn = 0
        return [
            {"role": "system", "content": "You are a helpful assistant with a calculator tool."},
            {"role": "user", "content": task["question"]},
        ]

    async def step(self, turn: AssistantTurn) -> StepResult:
        self.turn += 1
        if self.turn > self.tool_turns:
            return StepResult(outcome=0.0, done=True)
        t0 = time.perf_counter()
        if self.delay_s:
            await anyio.sleep(self.delay_s)
        result = f"calculator result #{self.turn}: 42"
        rec = ToolCallRecord(
            name="calc",
            arguments={"turn": self.turn},
            result=result,
            result_chars=len(result),
            latency_s=time.perf_counter() - t0,
        )
        return StepResult(
            observations=[{"role": "tool", "content": result}], info={"tool_calls": [rec]}
        )


def _engine(env, sampler, renderer, concurrency: int, max_new: int, tool_turns: int):
    from agentrl.config import Config, RolloutConfig, SamplerConfig
    from agentrl.rollout import RolloutEngine
    from agentrl.run.settings import rollout_settings

    cfg = RolloutConfig(
        group_size=1,
        concurrency=concurrency,
        max_turns=tool_turns + 1,
        max_tool_calls=tool_turns,
        max_tokens=4096,
    )
    return RolloutEngine(
        env,
        sampler,
        renderer,
        rollout_settings(Config(rollout=cfg, sampler=SamplerConfig(max_new_tokens=max_new))),
    )


class RecordingSampler:
    """Passes requests to a sampler and records (prompt, params) of each, for replay."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.requests: list[tuple[list[int], Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def generate(self, prompt_ids, params):
        self.requests.append((list(prompt_ids), params))
        return await self._inner.generate(prompt_ids, params)


async def raw_tokens_per_s(
    sampler, requests: list[tuple[list[int], Any]], concurrency: int
) -> dict[str, float]:
    """`concurrency` callers calling generate back to back on `requests`, in order."""
    queue = list(reversed(requests))
    tokens = 0

    async def caller() -> None:
        nonlocal tokens
        while queue:
            prompt, params = queue.pop()
            gen = await sampler.generate(prompt, params)
            tokens += len(gen.token_ids)

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(caller)
    wall = time.perf_counter() - t0
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall}


async def engine_tokens_per_s(
    sampler,
    renderer,
    concurrency: int,
    episodes: int,
    max_new: int,
    tool_turns: int,
    delay_s: float,
) -> dict[str, float]:
    env = DelayToolEnv(delay_s=delay_s, tool_turns=tool_turns)
    engine = _engine(env, sampler, renderer, concurrency, max_new, tool_turns)
    t0 = time.perf_counter()
    groups = await engine.collect(episodes)
    wall = time.perf_counter() - t0
    trajs = [t for g in groups for t in g.trajectories]
    bad = [t for t in trajs if t.status == "infra_error"]
    if bad:
        raise RuntimeError(f"benchmark episode failed: {bad[0].error}")
    tokens = sum(t.num_model_tokens for t in trajs)
    turns = sum(len(t.turns) for t in trajs)
    return {
        "episodes": len(trajs),
        "turns": turns,
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "episodes_per_s": len(trajs) / wall,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from agentrl.chat import ChatRenderer
    from agentrl.models import load_model
    from agentrl.samplers import create_sampler

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model)
    sampler = create_sampler("hf", model=(model, tokenizer), max_batch_size=64, seed=0)
    renderer = ChatRenderer(tokenizer, tools=[])
    env = DelayToolEnv()
    prompt = renderer.prompt_ids(await env.reset(next(env.tasks())))
    out: dict[str, Any] = {}
    try:
        from agentrl.samplers import SamplingParams

        params = SamplingParams(
            max_new_tokens=args.max_new_tokens, stop_token_ids=renderer.stop_token_ids
        )
        await raw_tokens_per_s(
            sampler, [(prompt, params.with_(max_new_tokens=8))] * 8, 4
        )  # warm-up

        # (1) overhead at the same concurrency, instant tool, same stop tokens and length cap.
        # Two raw references: the same first-turn prompt every call (what a single-turn
        # workload gets), and a replay of exactly the requests the engine made (same prompts,
        # which grow with the conversation: the hf sampler re-prefills them every turn).
        c, turns, max_new = args.overhead_concurrency, args.tool_turns, args.max_new_tokens
        episodes = args.overhead_episodes
        calls = episodes * (turns + 1)
        raw_short = await raw_tokens_per_s(sampler, [(prompt, params)] * calls, c)
        engine_runs, same_runs = [], []
        for _ in range(args.rounds):  # alternate, so drift of a shared machine hits both
            rec = RecordingSampler(sampler)
            engine_runs.append(
                await engine_tokens_per_s(rec, renderer, c, episodes, max_new, turns, 0.0)
            )
            same_runs.append(await raw_tokens_per_s(sampler, rec.requests, c))
            _progress(
                f"overhead: engine {engine_runs[-1]['tokens_per_s']:.1f}, "
                f"raw(same requests) {same_runs[-1]['tokens_per_s']:.1f} tok/s"
            )
        eng = {**engine_runs[0], "tokens_per_s": _median([r["tokens_per_s"] for r in engine_runs])}
        raw_same = {
            "tokens_per_s": _median([r["tokens_per_s"] for r in same_runs]),
            "runs": same_runs,
        }
        eng["runs"] = engine_runs
        mean_prompt = sum(len(p) for p, _ in rec.requests) / len(rec.requests)
        out["overhead"] = {
            "concurrency": c,
            "episodes": episodes,
            "turns_per_episode": turns + 1,
            "max_new_tokens": max_new,
            "raw_short_prompt": {**raw_short, "prompt_tokens": len(prompt)},
            "raw_same_requests": {**raw_same, "mean_prompt_tokens": mean_prompt},
            "engine": eng,
            "ratio_vs_same_requests": eng["tokens_per_s"] / raw_same["tokens_per_s"],
            "ratio_vs_short_prompt": eng["tokens_per_s"] / raw_short["tokens_per_s"],
            "target": 0.9,
        }

        # (2) 200 ms tool latency, scaling with actors
        scaling = []
        base = None
        for actors in args.actors:
            n = max(args.min_episodes, 2 * actors)
            r = await engine_tokens_per_s(
                sampler, renderer, actors, n, max_new, turns, args.tool_delay
            )
            r["actors"] = actors
            base = base or r["episodes_per_s"]
            r["speedup"] = r["episodes_per_s"] / base
            r["ideal_speedup"] = actors / args.actors[0]
            r["efficiency"] = r["speedup"] / r["ideal_speedup"]
            scaling.append(r)
            _progress(f"actors={actors}: {r['episodes_per_s']:.2f} episodes/s")
        out["tool_latency"] = {
            "tool_delay_s": args.tool_delay,
            "tool_calls_per_episode": turns,
            "rows": scaling,
            "saturates_at": _saturation(scaling),
        }
    finally:
        await sampler.close()
    out["meta"] = {
        "model": args.model,
        "sampler": "hf (continuous batching, max_batch_size 64)",
        "torch_threads": args.threads,
        "device": "cpu",
        "cpu_count": os.cpu_count(),
        "load_avg_1m_at_end": os.getloadavg()[0],
        "platform": platform.platform(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return out


def _median(xs: list[float]) -> float:
    ys = sorted(xs)
    n = len(ys)
    return ys[n // 2] if n % 2 else (ys[n // 2 - 1] + ys[n // 2]) / 2


def _progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _saturation(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """First actor count whose scaling efficiency drops below 50 % (None = none saturated)."""
    for prev, row in itertools.pairwise(rows):
        grew = row["episodes_per_s"] / prev["episodes_per_s"]
        if row["efficiency"] < 0.5 or grew < 1.1:
            return {
                "actors": row["actors"],
                "between": [prev["actors"], row["actors"]],
                "episodes_per_s": row["episodes_per_s"],
                "efficiency": row["efficiency"],
            }
    return {"actors": None}


def print_tables(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    o = res["overhead"]
    t = Table(title=f"(1) overhead at concurrency {o['concurrency']} · {res['meta']['model']}")
    for col in ("path", "tokens/s", "ratio vs raw", "target"):
        t.add_column(col, justify="right")
    same = o["raw_same_requests"]["tokens_per_s"]
    t.add_row("raw sampler, the engine's requests replayed", f"{same:.1f}", "1.00", "")
    t.add_row(
        f"raw sampler, first-turn prompt only ({o['raw_short_prompt']['prompt_tokens']} tok)",
        f"{o['raw_short_prompt']['tokens_per_s']:.1f}",
        f"{o['raw_short_prompt']['tokens_per_s'] / same:.2f}",
        "",
    )
    t.add_row(
        f"engine trajectories ({o['turns_per_episode']} turns)",
        f"{o['engine']['tokens_per_s']:.1f}",
        f"{o['ratio_vs_same_requests']:.2f}",
        ">= 0.90",
    )
    console.print(t)
    tl = res["tool_latency"]
    t = Table(
        title=f"(2) tool latency {tl['tool_delay_s'] * 1000:.0f} ms × {tl['tool_calls_per_episode']} calls/episode"
    )
    for col in ("actors", "episodes", "episodes/s", "speedup", "ideal", "efficiency", "tokens/s"):
        t.add_column(col, justify="right")
    for r in tl["rows"]:
        t.add_row(
            str(r["actors"]),
            str(r["episodes"]),
            f"{r['episodes_per_s']:.2f}",
            f"{r['speedup']:.1f}x",
            f"{r['ideal_speedup']:.0f}x",
            f"{r['efficiency']:.0%}",
            f"{r['tokens_per_s']:.0f}",
        )
    console.print(t)
    sat = tl["saturates_at"]
    if sat["actors"] is None:
        console.print("no saturation up to the largest actor count")
    else:
        console.print(
            f"sampler saturates between {sat['between'][0]} and {sat['between'][1]} actors "
            f"(efficiency {sat['efficiency']:.0%} at {sat['actors']})"
        )
    console.print(f"load average (1 min) at the end: {res['meta']['load_avg_1m_at_end']:.1f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--max-new-tokens", type=int, default=16, help="tokens per assistant turn")
    p.add_argument("--tool-turns", type=int, default=2, help="tool calls per episode")
    p.add_argument("--overhead-concurrency", type=int, default=16)
    p.add_argument("--overhead-episodes", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3, help="alternating engine/raw rounds (median)")
    p.add_argument("--tool-delay", type=float, default=0.2)
    p.add_argument(
        "--actors", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64]
    )
    p.add_argument("--min-episodes", type=int, default=8)
    p.add_argument("--quick", action="store_true", help="tiny-llama, fewer episodes (smoke)")
    p.add_argument("--out", type=Path, default=RESULTS / "rollout.json")
    args = p.parse_args()
    if args.quick:
        args.model, args.overhead_episodes, args.min_episodes = "tiny-llama", 16, 4
        args.actors = [1, 8]
        args.out = args.out.with_name("rollout_quick.json")
    res = anyio.run(run, args)
    print_tables(res)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
