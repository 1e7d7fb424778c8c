"""Where the hf sampler's time goes at small batch (16 rows x 64 tokens, SmolLM2-135M).

16 concurrent callers of ``HFSampler.generate`` (one 46-token prompt, 64 new tokens each,
eos ignored, temperature 1), as in ``benchmarks/samplers.py --concurrency 16``. Two passes
per dtype after a warm-up:

1. Timing: the sampler's own loop, timed on the instance (wrapped methods, forward hooks on
   the model): prefill, the decode steps' model forward, sampling (``sample_next``: softmax,
   log-probs, the draw), the per-step bookkeeping (finished rows, token lists, the input
   tensors), and what is left of the wall time (the worker thread waiting, asyncio).
2. Operators: ``torch.profiler`` over the same run; the decode forwards' operator self time
   split into matrix products, attention, and the rest (norms, rotary, activations, copies),
   and the forward's wall time not spent in any operator (Python modules, dispatch).

    .venv/bin/python benchmarks/sampler_profile.py [--dtypes float32 bfloat16]

Prints a table and writes benchmarks/results/sampler_profile.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio
import torch

ROOT = Path(__file__).resolve().parent.parent
ROWS, NEW_TOKENS, PROMPT_TOKENS = 16, 64, 46

MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")
ATTENTION = ("aten::_scaled_dot_product", "aten::scaled_dot_product", "aten::_softmax")


class Clock:
    """Seconds spent in each wrapped part of the sampler, summed over a run, by phase."""

    def __init__(self) -> None:
        self.s: dict[str, float] = defaultdict(float)
        self.phase = "other"
        self.profiling = False
        self._t0 = 0.0
        self._range: Any = None

    def wrap(self, obj: Any, name: str, part: str, phase: str | None = None) -> None:
        inner = getattr(obj, name)

        def timed(*a: Any, **kw: Any) -> Any:
            prev = self.phase
            if phase is not None:
                self.phase = phase
            t0 = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                self.s[f"{part}:{self.phase}"] += time.perf_counter() - t0
                self.phase = prev

        setattr(obj, name, timed)

    def hook(self, model: torch.nn.Module) -> None:
        def pre(*_: Any) -> None:
            if self.profiling:
                self._range = torch.profiler.record_function(f"forward:{self.phase}")
                self._range.__enter__()
            self._t0 = time.perf_counter()

        def post(*_: Any) -> None:
            self.s[f"forward:{self.phase}"] += time.perf_counter() - self._t0
            if self._range is not None:
                self._range.__exit__(None, None, None)
                self._range = None

        model.register_forward_pre_hook(pre)
        model.register_forward_hook(post)


async def run(sampler: Any, prompt: list[int]) -> float:
    from agentrl.samplers import SamplingParams

    params = SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS)
    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(ROWS):
            tg.start_soon(sampler.generate, prompt, params)
    return time.perf_counter() - t0


def profile_dtype(model_name: str, dtype: str) -> dict[str, Any]:
    from agentrl.models import load_model
    from agentrl.samplers.hf import HFSampler

    model, tok = load_model(model_name, dtype=dtype)
    sampler = HFSampler(model, tok, max_batch_size=ROWS, default_stop_token_ids=())
    prompt = tok("Write a short story about a robot who learns to paint.")["input_ids"]
    prompt = (prompt * (PROMPT_TOKENS // len(prompt) + 1))[:PROMPT_TOKENS]
    anyio.run(run, sampler, prompt)  # warm-up

    clock = Clock()
    clock.hook(sampler._model)
    clock.wrap(sampler, "_prefill", "prefill", phase="prefill")
    clock.wrap(sampler, "_decode_step", "step", phase="decode")
    clock.wrap(sampler, "_sample", "sampling")
    clock.wrap(sampler, "_finish_rows", "finished rows")
    wall = anyio.run(run, sampler, prompt)
    c = clock.s
    parts = {
        "prefill (forward, first token, bookkeeping)": c["prefill:prefill"],
        "decode: model forward": c["forward:decode"],
        "decode: sampling (sample_next, token lists)": c["sampling:decode"],
        "decode: finished rows": c["finished rows:decode"],
        "decode: the rest (input tensors, cache, lock)": c["step:decode"]
        - c["forward:decode"]
        - c["sampling:decode"]
        - c["finished rows:decode"],
        "outside the loop (thread handoff, asyncio)": wall
        - c["prefill:prefill"]
        - c["step:decode"],
    }
    timing = dict(c)

    # operator split of the decode forwards, from a profiled run
    from torch.profiler import ProfilerActivity, profile

    # the profiler only sees the thread that starts it: the sampler's worker thread, from
    # its first decode step to its last
    prof = profile(activities=[ProfilerActivity.CPU])
    decode_step = sampler._decode_step
    calls = [0]

    def profiled_step() -> None:
        if calls[0] == 0:
            prof.start()
        decode_step()
        calls[0] += 1
        if not sampler._active:  # every row finished
            prof.stop()

    sampler._decode_step = profiled_step
    clock.s = defaultdict(float)
    clock.profiling = True
    anyio.run(run, sampler, prompt)
    clock.profiling = False
    sampler._decode_step = decode_step
    ops: dict[str, float] = defaultdict(float)
    forward_wall = 0.0
    for ev in prof.events():
        if ev.name == "forward:decode":
            forward_wall += ev.cpu_time_total / 1e6
            continue
        parent = ev.cpu_parent
        while parent is not None and parent.name != "forward:decode":
            parent = parent.cpu_parent
        if parent is None or not ev.name.startswith("aten::"):
            continue
        kind = (
            "matrix products"
            if ev.name in MATMUL
            else "attention"
            if ev.name.startswith(ATTENTION)
            else "other operators"
        )
        ops[kind] += ev.self_cpu_time_total / 1e6
    ops["outside any operator (Python modules, dispatch)"] = forward_wall - sum(ops.values())
    return {
        "dtype": dtype,
        "wall_s": wall,
        "tokens_per_s": ROWS * NEW_TOKENS / wall,
        "decode_steps": calls[0],
        "parts_s": parts,
        "timing_raw_s": timing,
        "profiled_decode_forward": {
            "wall_s": forward_wall,
            "split_s": dict(ops),
            "note": "under torch.profiler (every operator call slowed): compare shares",
        },
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sampler_profile.json"))
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    load0 = os.getloadavg()[0]
    results = [profile_dtype(args.model, d) for d in args.dtypes]
    for r in results:
        print(
            f"\nhf sampler, {ROWS} rows x {NEW_TOKENS} tokens, {args.model} {r['dtype']}, "
            f"{r['threads']} threads: {r['wall_s']:.2f} s, {r['tokens_per_s']:.1f} tok/s"
        )
        for part, s in r["parts_s"].items():
            print(f"  {part:<52}{s:>7.2f} s {s / r['wall_s']:>5.0%}")
        p = r["profiled_decode_forward"]
        print(f"  decode forwards under the profiler ({p['wall_s']:.2f} s):")
        for kind, s in p["split_s"].items():
            print(f"    {kind:<50}{s:>7.2f} s {s / p['wall_s']:>5.0%}")
    out = {
        "benchmark": "sampler_profile",
        "model": args.model,
        "workload": {"rows": ROWS, "new_tokens": NEW_TOKENS, "prompt_tokens": PROMPT_TOKENS},
        "results": results,
        "cpus": os.cpu_count(),
        "loadavg_1m_before_after": [load0, os.getloadavg()[0]],
    }
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
