"""torch's float32 linear (MKL's sgemm on x86 wheels) vs oneDNN's, on the products agentrl
runs on a CPU (issue 51; ``model.cpu_linear``, :mod:`agentrl.cpu_linear`).

SmolLM2-135M's shapes: a decode step of 16 rows (576 -> 1536, 1536 -> 576, the LM head
576 -> 49152) and a learner micro-batch of 1,120 tokens. Per product: ``F.linear``,
oneDNN with the plain weight (what ``CpuLinear`` calls), oneDNN with the weight prepacked
(``torch.ops.mkldnn._reorder_linear_weight``: what inductor's CPU freezing does), and the
largest difference from a float64 reference in each. Three rounds, the kernels
interleaved in each; the best call of each round is kept and all three are printed.
``torch.backends.cpu.get_cpu_capability()`` and the ISA environment variables
(``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``, ``MKL_ENABLE_INSTRUCTIONS``) go into the
JSON, so a run held to AVX2 says so.

    .venv/bin/python benchmarks/cpu_gemm.py [--out benchmarks/results/cpu_gemm.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [  # (rows, in, out, what)
    (16, 576, 1536, "decode: q/gate/up"),
    (16, 1536, 576, "decode: down"),
    (16, 576, 49152, "decode: LM head"),
    (1120, 576, 1536, "learner: gate/up"),
    (1120, 1536, 576, "learner: down"),
    (1120, 576, 49152, "learner: LM head"),
]
ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def best_us(fn, calls: int) -> float:
    best = float("inf")
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/cpu_gemm.json"))
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    lp = torch.ops.mkldnn._linear_pointwise
    gen = torch.Generator().manual_seed(0)
    rows = []
    with torch.no_grad():
        for m, k, n, what in SHAPES:
            x = torch.randn(m, k, generator=gen)
            w = torch.randn(n, k, generator=gen)
            packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
            kernels = {
                "torch": lambda x=x, w=w: F.linear(x, w),
                "onednn": lambda x=x, w=w: lp(x, w, None, "none", [], ""),
                "onednn_packed": lambda x=x, p=packed: lp(x, p, None, "none", [], ""),
            }
            ref = x.double() @ w.double().T
            err = {name: float((fn().double() - ref).abs().max()) for name, fn in kernels.items()}
            calls = max(3, min(200, int(2e9 / (2 * m * k * n))))
            for fn in kernels.values():
                fn()  # warm-up: oneDNN builds its primitive on first use
            rounds = {name: [] for name in kernels}
            for _ in range(args.rounds):
                for name, fn in kernels.items():
                    rounds[name].append(best_us(fn, calls))
            best = {name: min(v) for name, v in rounds.items()}
            rows.append(
                {
                    "rows": m, "in": k, "out": n, "what": what, "calls": calls,
                    "us": rounds, "best_us": best,
                    "gflops": {name: 2 * m * k * n / us / 1e3 for name, us in best.items()},
                    "onednn_speedup": best["torch"] / best["onednn"],
                    "onednn_packed_speedup": best["torch"] / best["onednn_packed"],
                    "max_abs_error_vs_float64": err,
                }
            )  # fmt: skip
            r = rows[-1]
            print(
                f"{m:>5} x {k:>5} -> {n:>6} ({what}): torch {best['torch']:9.0f} us | oneDNN "
                f"{best['onednn']:9.0f} us ({r['onednn_speedup']:.2f}x) | packed "
                f"{best['onednn_packed']:9.0f} us ({r['onednn_packed_speedup']:.2f}x)",
                flush=True,
            )
    flags = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    out = {
        "benchmark": "cpu_gemm",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "isa_env": {k: os.environ.get(k) for k in ENV},
        "cpu_flags": sorted(f for f in flags if f.startswith(("avx", "amx", "fma"))),
        "loadavg": os.getloadavg(),
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
