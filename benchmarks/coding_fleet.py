"""A fleet of repository episodes on one machine: episodes/s and sandbox starts/s at 100
concurrent episodes (the `repo` environment, docs/coding_agents.md "Scale").

    nice -n 10 .venv/bin/python benchmarks/coding_fleet.py [--episodes 100] [--rates 0,20]

Each episode is what an agent's episode costs the host without the model: reset (fork the
task's prepared workspace), ``shell`` (ls + grep), ``view``, ``edit`` (the reference fix),
then the reward (the hidden tests in a clean grading sandbox), all through the real tools,
sandboxes and grader. ``--episodes`` of them start at once in one run scope (as a rollout
worker runs its share of a fleet), once per start rate in ``--rates`` (0: unlimited;
``repo``'s ``sandbox_starts_per_s``). Measured per row: wall time, episodes/s, sandbox
starts and starts/s, episode latency p50/p95, rewards (every episode should score 1), infra
errors, the time starts waited for the rate (summed over the waiting starts), peak live
interpreters. Prints a table and
writes benchmarks/results/coding_fleet.json with the machine's load average: on a shared
box every number moves with it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import anyio

from agentrl.envs import make_env
from agentrl.envs.base import AssistantTurn
from agentrl.envs.coding.repo_diff import apply_diff, parse_diff
from agentrl.envs.repo import tool_call_text
from agentrl.resources import ResourceScope
from agentrl.sandbox import core as sandbox_core

RESULTS = Path(__file__).resolve().parent / "results"


class StartLog:
    """Counts interpreter starts across every sandbox of the process (benchmark only)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.live = 0
        self.peak_live = 0
        self.waited_s = 0.0
        original = sandbox_core.Sandbox._spawn
        log = self

        def counted(sb: sandbox_core.Sandbox) -> Any:
            log.times.append(time.perf_counter())
            kernel = original(sb)
            log.peak_live = max(log.peak_live, _live_total())
            return kernel

        self._sandboxes: list[sandbox_core.Sandbox] = []
        init = sandbox_core.Sandbox.__init__

        def tracked_init(sb: sandbox_core.Sandbox, *a: Any, **k: Any) -> None:
            init(sb, *a, **k)
            log._sandboxes.append(sb)

        def _live_total() -> int:
            return sum(len(sb._live) for sb in log._sandboxes if not sb.closed)

        sandbox_core.Sandbox._spawn = counted  # type: ignore[method-assign]
        sandbox_core.Sandbox.__init__ = tracked_init  # type: ignore[method-assign]

    def paces_waited(self) -> float:
        paces = {id(sb._pace): sb._pace for sb in self._sandboxes}
        return sum(p.waited_s for p in paces.values())


def _call(name: str, **arguments: str) -> AssistantTurn:
    return AssistantTurn(tool_call_text(name, arguments), [])


async def episode(base: Any, task: dict[str, Any]) -> dict[str, Any]:
    env = base.spawn()
    t0 = time.perf_counter()
    infra = 0
    try:
        await env.reset(task)
        path = parse_diff(task["reference_fix"])[0].path
        fixed = apply_diff(task["files"], task["reference_fix"]).files[path]
        for turn in (
            _call("shell", command="ls; grep -rn 'def ' --include=*.py . | head -5"),
            _call("view", path=path),
            _call("edit", path=path, old="", new=fixed),
        ):
            result = await env.step(turn)
            infra += sum(bool(o.get("infra_error")) for o in result.observations)
        await env.step(AssistantTurn("DONE", []))
        reward, _ = await env.reward(None)
    finally:
        await env.close()
    return {"reward": reward, "seconds": time.perf_counter() - t0, "infra": infra}


async def fleet(n: int, rate: float, log: StartLog) -> dict[str, Any]:
    base = make_env("repo", test_timeout_s=20, sandbox_starts_per_s=rate)
    tasks = list(base.tasks("train"))
    results: list[dict[str, Any]] = []
    starts_before, waited_before = len(log.times), log.paces_waited()
    log.peak_live = 0
    t0 = time.perf_counter()
    async with ResourceScope("run") as run:

        async def one(i: int) -> None:
            results.append(await episode(base, tasks[i % len(tasks)]))

        with run.active():  # the episodes' tools share the run's grader pool and start rate
            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(one, i)
    wall = time.perf_counter() - t0
    starts = len(log.times) - starts_before
    seconds = sorted(r["seconds"] for r in results)
    return {
        "episodes": n,
        "starts_per_s_limit": rate,
        "wall_s": round(wall, 2),
        "episodes_per_s": round(n / wall, 2),
        "sandbox_starts": starts,
        "starts_per_s": round(starts / wall, 2),
        "episode_p50_s": round(statistics.median(seconds), 2),
        "episode_p95_s": round(seconds[min(len(seconds) - 1, round(0.95 * (len(seconds) - 1)))], 2),
        "mean_reward": round(sum(r["reward"] for r in results) / n, 3),
        "infra_errors": sum(r["infra"] for r in results),
        "start_wait_s": round(log.paces_waited() - waited_before, 2),
        "peak_live_interpreters": log.peak_live,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--rates", default="0,20", help="sandbox_starts_per_s values (0: none)")
    args = ap.parse_args()
    log = StartLog()
    rows = [anyio.run(fleet, args.episodes, float(r), log) for r in args.rates.split(",")]
    machine = {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "load_avg_after": os.getloadavg(),
        "python": platform.python_version(),
    }
    keys = list(rows[0])
    print(" | ".join(keys))
    for row in rows:
        print(" | ".join(str(row[k]) for k in keys))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "coding_fleet.json"
    out.write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
