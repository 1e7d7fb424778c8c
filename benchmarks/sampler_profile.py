"""Where the hf sampler's time goes at small batch (16 rows x 64 tokens, SmolLM2-135M).

16 concurrent callers of ``HFSampler.generate`` (one 46-token prompt, 64 new tokens each,
eos ignored, temperature 1), as in ``benchmarks/samplers.py --concurrency 16``. After a
warm-up run, timed runs: the sampler's own loop, timed on the instance (wrapped methods,
forward hooks on the model): prefill, the decode steps' model forward (split into the
decoder layers and the LM head on transformers' path), sampling (``sample_next``: softmax,
log-probs, the draw), the per-step bookkeeping (finished rows, the input tensors), and
what is left of the wall time (the worker thread waiting, asyncio).

Each dtype runs the decode paths of the sampler side by side on the same model, in
alternating order, best of ``--repeats``: ``fast`` (the compact decode step,
:mod:`agentrl.samplers.fast_decode`, the default on CPU: in float32 where the kernels of
:mod:`agentrl.samplers.skinny_gemm` build, the whole step as one compiled call),
``fast-py`` (the same step in Python, one torch op at a time, its linears on the compiled
few-row GEMM), ``fast-mm`` (the Python step on torch's GEMMs) and ``transformers`` (the
model's own forward, ``fast_decode=False``).

``--gemm`` times only the step's weight GEMMs, cold (all the model's linear weights once
per pass, ~0.5 GB in float32) at each ``--rows``: torch's two layouts and the kernel, beside
a plain sum over the same bytes.

    .venv/bin/python benchmarks/sampler_profile.py [--dtypes float32 bfloat16]
        [--decode fast fast-py fast-mm transformers] [--repeats 2] [--rows 16 15] [--gemm]

Prints a table and writes benchmarks/results/sampler_profile.json (``--gemm``:
sampler_profile_gemm.json).
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

    def hook(self, model: torch.nn.Module) -> list[Any]:
        def pre(*_: Any) -> None:
            self._t0 = time.perf_counter()

        def post(*_: Any) -> None:
            self.s[f"forward:{self.phase}"] += time.perf_counter() - self._t0

        return [model.register_forward_pre_hook(pre), model.register_forward_hook(post)]


async def run(sampler: Any, prompt: list[int], rows: int = ROWS) -> float:
    from agentrl.samplers import SamplingParams

    params = SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS)
    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(rows):
            tg.start_soon(sampler.generate, prompt, params)
    return time.perf_counter() - t0


def profile_dtype(
    model_name: str, dtype: str, paths: list[str], repeats: int, rows: int = ROWS
) -> list[dict[str, Any]]:
    from agentrl.models import load_model
    from agentrl.samplers.hf import HFSampler

    model, tok = load_model(model_name, dtype=dtype)
    prompt = tok("Write a short story about a robot who learns to paint.")["input_ids"]
    prompt = (prompt * (PROMPT_TOKENS // len(prompt) + 1))[:PROMPT_TOKENS]
    samplers = {}
    for path in paths:
        samplers[path] = HFSampler(
            model,
            tok,
            max_batch_size=rows,
            default_stop_token_ids=(),
            fast_decode=path != "transformers",
            prefix_cache_tokens=0,  # every run prefills the same way
        )
        if path != "transformers":
            if samplers[path]._fast is None:
                raise SystemExit(f"{model_name}: the compact decode step does not apply")
            samplers[path]._fast.skinny = path != "fast-mm"  # fast-mm: torch's GEMMs
            samplers[path]._fast.one_call = path == "fast"  # fast-py: a Python step
        anyio.run(run, samplers[path], prompt, rows)  # warm-up
    best: dict[str, dict[str, Any]] = {}
    for rep in range(repeats):
        order = paths if rep % 2 == 0 else paths[::-1]
        for path in order:
            r = _profile_once(samplers[path], prompt, rows)
            if path not in best or r["wall_s"] < best[path]["wall_s"]:
                best[path] = r
    return [
        {
            "dtype": dtype,
            "decode": path,
            "rows": rows,
            "threads": torch.get_num_threads(),
            **best[path],
        }
        for path in paths
    ]


def _profile_once(sampler: Any, prompt: list[int], rows: int) -> dict[str, Any]:
    clock = Clock()
    model = sampler._model
    handles = []
    if sampler._fast is not None:
        clock.wrap(sampler._fast, "step", "forward")  # an instance attribute, removed below
    else:
        handles = clock.hook(model)
    clock.wrap(sampler, "_prefill", "prefill", phase="prefill")
    clock.wrap(sampler, "_decode_step", "step", phase="decode")
    clock.wrap(sampler, "_sample", "sampling")
    clock.wrap(sampler, "_finish_rows", "finished rows")
    clock.wrap(model.model, "forward", "layers")
    clock.wrap(model.lm_head, "forward", "lm_head")
    try:
        wall = anyio.run(run, sampler, prompt, rows)
    finally:
        for h in handles:
            h.remove()
        for obj, name in (
            (sampler, "_prefill"),
            (sampler, "_decode_step"),
            (sampler, "_sample"),
            (sampler, "_finish_rows"),
            (model.model, "forward"),
            (model.lm_head, "forward"),
            (sampler._fast, "step"),
        ):
            if obj is not None and name in vars(obj):
                delattr(obj, name)
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
    return {
        "wall_s": wall,
        "tokens_per_s": rows * NEW_TOKENS / wall,
        "decode_step_ms": 1000 * c["step:decode"] / max(NEW_TOKENS - 1, 1),
        "parts_s": parts,
        "timing_raw_s": dict(c),
        # transformers' path only (the compact step calls no module forward)
        "decoder_layers_s": c["layers:decode"],
        "lm_head_s": c["lm_head:decode"],
    }


def gemm_table(args: argparse.Namespace) -> None:
    """The decode step's weight GEMMs alone, cold: every linear weight of the model's 30
    layers plus the LM head (~0.5 GB in float32, far beyond the caches) against `rows`
    rows, as torch's ``W @ x^T`` (rows padded to 8), ``x @ W^T`` and the compiled kernel;
    beside a plain sum over the same bytes (what the cores can stream)."""
    from agentrl.models import load_model
    from agentrl.samplers import fast_decode, skinny_gemm

    model, _ = load_model(args.model, dtype="float32")
    weights = [p.detach() for p in model.parameters() if p.dim() == 2]  # embed = LM head
    total = sum(w.numel() * 4 for w in weights)
    if not skinny_gemm.available():
        raise SystemExit(f"the kernel is not built here: {skinny_gemm._broken}")
    ways = {
        "torch W @ x^T": lambda x, w: fast_decode.linear(x, w, skinny=False),
        "torch x @ W^T": lambda x, w: torch.mm(x, w.t()),
        "kernel": lambda x, w: skinny_gemm.skinny_linear(x, w),
    }
    rows_out = []
    for rows in args.rows:
        x = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}
        times: dict[str, list[float]] = {k: [] for k in [*ways, "sum (streaming)"]}
        for rep in range(args.repeats + 1):  # the first pass warms up
            for name, f in ways.items():
                t0 = time.perf_counter()
                for w in weights:
                    f(x[w.shape[1]], w)
                if rep:
                    times[name].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for w in weights:
                w.sum()
            if rep:
                times["sum (streaming)"].append(time.perf_counter() - t0)
        row = {"rows": rows, "threads": torch.get_num_threads(), "bytes": total}
        for name, ts in times.items():
            best = min(ts)
            row[name] = {"ms": best * 1e3, "gb_per_s": total / best / 1e9}
            print(
                f"{rows:>3} rows  {name:<16}{best * 1e3:>8.1f} ms  {total / best / 1e9:>6.1f} GB/s"
            )
        rows_out.append(row)
    out = {
        "benchmark": "sampler_profile --gemm",
        "model": args.model,
        "note": "all 2-D weights once per pass (the 30 layers' linears and the LM head), cold",
        "repeats": args.repeats,
        "results": rows_out,
        "cpus": os.cpu_count(),
    }
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument(
        "--decode",
        nargs="+",
        default=["fast", "fast-py", "fast-mm", "transformers"],
        choices=["fast", "fast-py", "fast-mm", "transformers"],
        help="fast-py: the compact step in Python over the compiled GEMM (one op at a time); "
        "fast-mm: that step on torch's GEMMs",
    )
    ap.add_argument(
        "--gemm",
        action="store_true",
        help="only the decode step's weight GEMMs, cold, at --rows rows (torch vs kernel)",
    )
    ap.add_argument("--repeats", type=int, default=2, help="best of N per path")
    ap.add_argument(
        "--rows",
        type=int,
        nargs="+",
        default=[ROWS],
        help="concurrent callers (decode rows); e.g. 16 15 12: ragged counts are where a "
        "GRPO batch spends its decode once rows finish",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="default benchmarks/results/sampler_profile.json (--gemm: sampler_profile_gemm.json)",
    )
    args = ap.parse_args()
    if args.out is None:
        name = "sampler_profile_gemm.json" if args.gemm else "sampler_profile.json"
        args.out = str(ROOT / "benchmarks" / "results" / name)
    sys.path.insert(0, str(ROOT))
    if args.gemm:
        return gemm_table(args)
    load0 = os.getloadavg()[0]
    results = [
        r
        for d in args.dtypes
        for n in args.rows
        for r in profile_dtype(args.model, d, args.decode, args.repeats, n)
    ]
    for r in results:
        print(
            f"\nhf sampler, {r['decode']} decode, {r['rows']} rows x {NEW_TOKENS} tokens, "
            f"{args.model} {r['dtype']}, {r['threads']} threads: {r['wall_s']:.2f} s, "
            f"{r['tokens_per_s']:.1f} tok/s, {r['decode_step_ms']:.0f} ms per decode step"
        )
        for part, s in r["parts_s"].items():
            print(f"  {part:<52}{s:>7.2f} s {s / r['wall_s']:>5.0%}")
        fwd = r["parts_s"]["decode: model forward"]
        if r["decode"] == "transformers" and fwd > 0:
            for part in ("decoder_layers_s", "lm_head_s"):
                print(f"    of the forward, {part[:-2]:<34}{r[part]:>7.2f} s {r[part] / fwd:>5.0%}")
    by = {(r["dtype"], r["rows"], r["decode"]): r for r in results}
    for d in args.dtypes:
        for n in args.rows:
            if (d, n, "fast") in by and (d, n, "transformers") in by:
                fast, slow = by[(d, n, "fast")], by[(d, n, "transformers")]
                ratio = fast["tokens_per_s"] / slow["tokens_per_s"]
                print(f"{d}, {n} rows: fast / transformers decode = {ratio:.2f}x tokens/s")
            if (d, n, "fast-py") in by and (d, n, "fast-mm") in by:
                py, mm = by[(d, n, "fast-py")], by[(d, n, "fast-mm")]
                ratio = py["tokens_per_s"] / mm["tokens_per_s"]
                print(f"{d}, {n} rows: kernel / torch GEMMs in the Python step = {ratio:.2f}x")
            if (d, n, "fast") in by and (d, n, "fast-py") in by:
                fast, py = by[(d, n, "fast")], by[(d, n, "fast-py")]
                ratio = fast["tokens_per_s"] / py["tokens_per_s"]
                print(f"{d}, {n} rows: one compiled call / Python step = {ratio:.2f}x")
    out = {
        "benchmark": "sampler_profile",
        "model": args.model,
        "workload": {"rows": args.rows, "new_tokens": NEW_TOKENS, "prompt_tokens": PROMPT_TOKENS},
        "repeats": args.repeats,
        "results": results,
        "cpus": os.cpu_count(),
        "loadavg_1m_before_after": [load0, os.getloadavg()[0]],
    }
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
