"""Where the hf sampler's time goes at small batch (16 rows x 64 tokens, SmolLM2-135M).

16 concurrent callers of ``HFSampler.generate`` (one 46-token prompt, 64 new tokens each,
eos ignored, temperature 1), as in ``benchmarks/samplers.py --concurrency 16``. After a
warm-up run, one timed run: the sampler's own loop, timed on the instance (wrapped methods,
forward hooks on the model): prefill, the decode steps' model forward (split into the
decoder layers and the LM head), sampling (``sample_next``: softmax, log-probs, the draw),
the per-step bookkeeping (finished rows, the input tensors), and what is left of the wall
time (the worker thread waiting, asyncio).

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
        self._t0 = 0.0

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
            self._t0 = time.perf_counter()

        def post(*_: Any) -> None:
            self.s[f"forward:{self.phase}"] += time.perf_counter() - self._t0

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
    clock.wrap(sampler._model.model, "forward", "layers")
    clock.wrap(sampler._model.lm_head, "forward", "lm_head")
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

    return {
        "dtype": dtype,
        "wall_s": wall,
        "tokens_per_s": ROWS * NEW_TOKENS / wall,
        "parts_s": parts,
        "timing_raw_s": timing,
        "decoder_layers_s": c["layers:decode"],
        "lm_head_s": c["lm_head:decode"],
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
        fwd = r["parts_s"]["decode: model forward"]
        for part in ("decoder_layers_s", "lm_head_s"):
            print(f"    of the forward, {part[:-2]:<34}{r[part]:>7.2f} s {r[part] / fwd:>5.0%}")
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
