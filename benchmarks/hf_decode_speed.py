"""The hf sampler's speed at 16 rows x 64 new tokens on SmolLM2-135M, two checkouts side by side.

Each measurement is a fresh process running one checkout's ``HFSampler`` with its default
options (16 concurrent ``generate`` callers, one 46-token prompt, 64 new tokens each, eos
ignored, temperature 1, after a warm-up): tokens/s over the whole call (prefill included)
and the mean decode step (the sampler's ``_decode_step``, sampling included). Checkouts and
dtypes are interleaved (A, B, A, B, ...) because a shared machine drifts; the table gives
medians, their ratio to the first checkout's, and the median of the ratios within each
round (the two measurements ran back to back, so load drift cancels best there).

    .venv/bin/python benchmarks/hf_decode_speed.py \\
        --python before=/work/main/.venv/bin/python --python after=.venv/bin/python \\
        [--dtypes float32 bfloat16] [--repeats 5] [--out benchmarks/results/hf_decode_speed.json]

Each ``--python`` is an interpreter whose environment imports the checkout to measure
(an editable install); the child runs from a neutral folder so nothing else is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ROWS, NEW_TOKENS, PROMPT_TOKENS = 16, 64, 46


def child(model_name: str, dtype: str, runs: int, threads: int) -> dict[str, Any]:
    import anyio
    import torch

    if threads:
        torch.set_num_threads(threads)

    import agentrl
    from agentrl.models import load_model
    from agentrl.samplers import SamplingParams
    from agentrl.samplers.hf import HFSampler

    model, tokenizer = load_model(model_name, dtype=dtype, device="cpu")
    sampler = HFSampler(model, tokenizer, max_batch_size=ROWS, seed=0, default_stop_token_ids=())
    decode = {"s": 0.0, "n": 0}
    inner = sampler._decode_step

    def timed() -> None:
        t0 = time.perf_counter()
        inner()
        decode["s"] += time.perf_counter() - t0
        decode["n"] += 1

    sampler._decode_step = timed  # type: ignore[method-assign]
    text = "Compute the sum of the first ten prime numbers and explain each step. " * 4
    prompt = tokenizer(text)["input_ids"][:PROMPT_TOKENS]

    async def once(new_tokens: int) -> float:
        params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
        counts: list[int] = []

        async def one() -> None:
            counts.append(len((await sampler.generate(prompt, params)).token_ids))

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(ROWS):
                tg.start_soon(one)
        assert sum(counts) == ROWS * new_tokens, counts
        return time.perf_counter() - t0

    async def main() -> dict[str, Any]:
        await once(8)  # warm-up
        walls, steps = [], []
        for _ in range(runs):
            decode["s"], decode["n"] = 0.0, 0
            walls.append(await once(NEW_TOKENS))
            steps.append(decode["s"] / max(1, decode["n"]))
        await sampler.close()
        best = min(range(runs), key=lambda i: walls[i])
        return {
            "tok_s": ROWS * NEW_TOKENS / walls[best],
            "wall_s": walls[best],
            "decode_step_ms": 1000 * steps[best],
            "agentrl": str(Path(agentrl.__file__).parent.parent),
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "torch_threads": torch.get_num_threads(),
        }

    return anyio.run(main)


def run_child(side: str, model: str, dtype: str, runs: int, threads: int) -> dict[str, Any]:
    python, _, path = side.partition("@")  # interpreter[@a folder to import agentrl from]
    cmd = [python, str(Path(__file__).resolve()), "--child", dtype, "--model", model]
    cmd += ["--runs", str(runs), "--threads", str(threads)]
    env = {**os.environ, "PYTHONPATH": path} if path else None
    with tempfile.TemporaryDirectory() as cwd:
        out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--python", action="append", default=[], help="NAME=interpreter[@folder on PYTHONPATH]"
    )
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--repeats", type=int, default=5, help="fresh processes per checkout")
    ap.add_argument("--runs", type=int, default=2, help="timed runs per process (best kept)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "hf_decode_speed.json"))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.model, args.child, args.runs, args.threads)))
        return
    sides = dict(p.split("=", 1) for p in args.python) or {"here": sys.executable}
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {
        d: {name: [] for name in sides} for d in args.dtypes
    }
    for rep in range(args.repeats):
        order = list(sides.items())
        if rep % 2:
            order.reverse()  # neither side always runs first
        for dtype in args.dtypes:
            for name, python in order:
                r = run_child(python, args.model, dtype, args.runs, args.threads)
                samples[dtype][name].append(r)
                print(
                    f"[{rep + 1}/{args.repeats}] {dtype:<9} {name:<8} {r['tok_s']:7.1f} tok/s  "
                    f"decode step {r['decode_step_ms']:6.1f} ms  ({r['agentrl']})",
                    flush=True,
                )
    first = next(iter(sides))
    table: dict[str, dict[str, Any]] = {}
    threads = args.threads or "default"
    where = f"{ROWS} rows x {NEW_TOKENS} tokens, {cpu_name()}, {threads} threads"
    print(f"\nmedians of {args.repeats}, {where}")
    print(
        f"{'dtype':<10}{'checkout':<10}{'tok/s':>8}{'step ms':>9}{'tok/s ratio':>13}"
        f"{'step ratio':>12}{'paired tok/s':>14}{'paired step':>13}"
    )
    for dtype, by_side in samples.items():
        table[dtype] = {}
        for name, rs in by_side.items():
            med = {
                "tok_s": statistics.median(r["tok_s"] for r in rs),
                "decode_step_ms": statistics.median(r["decode_step_ms"] for r in rs),
                "computes_in": rs[0]["dtype"],
            }
            table[dtype][name] = med
        base = table[dtype][first]
        for name, med in table[dtype].items():
            med["tok_s_ratio"] = med["tok_s"] / base["tok_s"]
            med["decode_step_ratio"] = med["decode_step_ms"] / base["decode_step_ms"]
            # the ratio within each round (the two ran back to back), then the median
            pairs = list(zip(by_side[name], by_side[first], strict=True))
            med["paired_tok_s_ratio"] = statistics.median(a["tok_s"] / b["tok_s"] for a, b in pairs)
            med["paired_decode_step_ratio"] = statistics.median(
                a["decode_step_ms"] / b["decode_step_ms"] for a, b in pairs
            )
            print(
                f"{dtype:<10}{name:<10}{med['tok_s']:8.1f}{med['decode_step_ms']:9.1f}"
                f"{med['tok_s_ratio']:13.2f}{med['decode_step_ratio']:12.2f}"
                f"{med['paired_tok_s_ratio']:14.2f}{med['paired_decode_step_ratio']:13.2f}"
            )
    result = {
        "benchmark": "hf_decode_speed",
        "cpu": cpu_name(),
        "rows": ROWS,
        "new_tokens": NEW_TOKENS,
        "prompt_tokens": PROMPT_TOKENS,
        "model": args.model,
        "repeats": args.repeats,
        "torch_threads": args.threads or "default",
        "checkouts": sides,
        "medians": table,
        "samples": samples,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
