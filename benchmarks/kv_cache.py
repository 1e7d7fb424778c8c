"""Decode throughput of the hf sampler with its in-place KV cache vs transformers' DynamicCache.

    python benchmarks/kv_cache.py [--model smollm2-135m-instruct] [--contexts 64 512 1024]
                                  [--callers 32] [--new-tokens 64] [--repeats 2]

`callers` concurrent ``HFSampler.generate`` calls on one prompt of each context length
(forwarded once: identical prompts share one prefill), fixed-length outputs (no stop
tokens), temperature 1, one sampler per ``kv_cache`` option (``growing`` is the default,
:mod:`agentrl.samplers.kv_cache`; ``dynamic`` concatenates the whole cache every decode
step). Runs alternate between the two (best of ``--repeats``), so machine load hits both
alike. Prints a table and writes benchmarks/results/kv_cache.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import anyio
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OPTIONS = ("growing", "dynamic")

from benchmarks.samplers import ours_once as tokens_per_s  # noqa: E402  (callers' tokens/s)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--contexts", type=int, nargs="+", default=[64, 512, 1024])
    ap.add_argument("--callers", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "kv_cache.json"))
    args = ap.parse_args()

    from agentrl.cpu import set_allocator
    from agentrl.models import load_model
    from agentrl.samplers.hf import HFSampler

    set_allocator("reuse")  # as a training run does
    model, tok = load_model(args.model)
    samplers = {
        kv: HFSampler(
            model,
            tok,
            max_batch_size=args.callers,
            default_stop_token_ids=(),
            prefix_cache_tokens=0,
            kv_cache=kv,
        )
        for kv in OPTIONS
    }
    rng = torch.Generator().manual_seed(0)

    async def run() -> dict[int, dict[str, float]]:
        best: dict[int, dict[str, float]] = {}
        for s in samplers.values():  # warm-up
            await tokens_per_s(s, [5] * 16, 2, 4)
        for ctx in args.contexts:
            prompt = torch.randint(3, 10_000, (ctx,), generator=rng).tolist()
            best[ctx] = {}
            for _ in range(args.repeats):
                for kv, s in samplers.items():
                    r = await tokens_per_s(s, prompt, args.callers, args.new_tokens)
                    best[ctx][kv] = max(best[ctx].get(kv, 0.0), r)
            print(
                f"  context {ctx:>5}: growing {best[ctx]['growing']:7.1f} tok/s, "
                f"dynamic {best[ctx]['dynamic']:7.1f} tok/s",
                flush=True,
            )
        for s in samplers.values():
            await s.close()
        return best

    load = os.getloadavg()[0]
    print(
        f"{args.model} ({model.dtype}), {args.callers} callers x {args.new_tokens} new tokens, "
        f"{torch.get_num_threads()} torch threads, load average {load:.1f}",
        flush=True,
    )
    best = anyio.run(run)
    print(f"\n{'prompt tokens':>13} | {'growing tok/s':>13} | {'dynamic tok/s':>13} | speedup")
    for ctx, row in best.items():
        print(
            f"{ctx:>13} | {row['growing']:>13.1f} | {row['dynamic']:>13.1f} | "
            f"{row['growing'] / row['dynamic']:.2f}x"
        )
    result = {
        "benchmark": "kv_cache",
        "model": args.model,
        "dtype": str(model.dtype),
        "callers": args.callers,
        "new_tokens": args.new_tokens,
        "cpu_count": os.cpu_count(),
        "loadavg_1m_before_after": [load, os.getloadavg()[0]],
        "tok_s": {str(c): r for c, r in best.items()},
        "speedup": {str(c): r["growing"] / r["dynamic"] for c, r in best.items()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
