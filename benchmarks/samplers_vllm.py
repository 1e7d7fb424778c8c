"""Tokens/s of the vllm sampler beside raw ``vllm.LLM.generate``, and weight-reload time.

Run in .venv-vllm (``make bench-vllm`` or ``.venv-vllm/bin/python benchmarks/samplers_vllm.py``).
Both engines get the same engine arguments and the same work: a fixed prompt, fixed-length
outputs (ignore_eos), temperature 1, the sampled token's log-prob. They run one after the
other (2 cores cannot host both fairly). Prints a table, writes JSON, and prints ONE final
JSON line (merged by benchmarks/samplers.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

CONCURRENCY = (1, 8, 32)


def raw_engine(args, engine_args, prompt):
    """Tokens/s of vllm.LLM.generate with a batch of `c` identical requests."""
    from vllm import LLM
    from vllm import SamplingParams as VParams
    from vllm.inputs import TokensPrompt

    llm = LLM(**{k: getattr(engine_args, k) for k in _LLM_KEYS})
    params = VParams(
        temperature=1.0, max_tokens=args.new_tokens, ignore_eos=True, logprobs=0, seed=0
    )
    llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)  # warm-up
    out = {}
    for c in CONCURRENCY:
        t0 = time.perf_counter()
        res = llm.generate([TokensPrompt(prompt_token_ids=prompt)] * c, params, use_tqdm=False)
        dt = time.perf_counter() - t0
        out[c] = sum(len(r.outputs[0].token_ids) for r in res) / dt
        print(f"  raw LLM.generate  c={c:<3} {out[c]:8.1f} tok/s", flush=True)
    llm.llm_engine.engine_core.shutdown()
    del llm
    return out


_LLM_KEYS = (
    "model", "dtype", "max_model_len", "max_num_seqs", "logprobs_mode", "max_logprobs",
    "enforce_eager", "seed",
)  # fmt: skip


async def ours(args, sampler, prompt):
    import anyio
    from safetensors.torch import load_file

    from agentrl.samplers.base import SamplingParams

    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=0)
    await sampler.start()
    sampler.ignore_eos = True
    await sampler.generate(prompt, params)  # warm-up
    out = {}
    for c in CONCURRENCY:
        counts = []

        async def one(i, counts=counts):
            g = await sampler.generate(prompt, params.with_(seed=i))
            counts.append(len(g))

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(c):
                tg.start_soon(one, i)
        dt = time.perf_counter() - t0
        out[c] = sum(counts) / dt
        print(f"  VLLMSampler       c={c:<3} {out[c]:8.1f} tok/s", flush=True)

    weights = load_file(str(sampler.model_dir / "model.safetensors"))
    nbytes = sum(t.numel() * t.element_size() for t in weights.values())
    reloads, copies = [], []
    for i in range(args.reloads):
        await sampler.update_weights(weights, sampler.version + 1)
        reloads.append(sampler.last_update_seconds)
        t0 = time.perf_counter()
        _ = {k: v.clone() for k, v in weights.items()}
        copies.append(time.perf_counter() - t0)
        print(f"  reload {i}: {reloads[-1]:.2f}s (memcpy floor {copies[-1]:.3f}s)", flush=True)
    await sampler.close()
    return out, {
        "reload_s_median": statistics.median(reloads),
        "reload_s_all": reloads,
        "memcpy_floor_s": statistics.median(copies),
        "weights_mb": nbytes / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--reloads", type=int, default=3)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--out", default="benchmarks/results/samplers_vllm.json")
    parser.add_argument("--skip-raw", action="store_true")
    args = parser.parse_args()

    import anyio

    from agentrl.samplers.vllm import VLLMSampler, configure_cpu_env

    configure_cpu_env()
    sampler = VLLMSampler(args.model, dtype=args.dtype, max_model_len=1024, max_batch_size=32)
    prompt = sampler.tokenizer("Write a short story about a robot who learns to paint.")[
        "input_ids"
    ]
    prompt = (prompt * (args.prompt_tokens // len(prompt) + 1))[: args.prompt_tokens]
    import os

    print(
        f"vllm benchmark: {args.model}, {args.prompt_tokens} prompt + {args.new_tokens} new "
        f"tokens, OMP bind {os.environ.get('VLLM_CPU_OMP_THREADS_BIND')}",
        flush=True,
    )
    raw = {} if args.skip_raw else raw_engine(args, sampler.engine_args(), prompt)
    mine, reload = anyio.run(ours, args, sampler, prompt)

    print(f"\n{'concurrency':>11} | {'raw LLM tok/s':>13} | {'VLLMSampler tok/s':>17} | ratio")
    for c in CONCURRENCY:
        r = raw.get(c)
        ratio = f"{mine[c] / r:.2f}" if r else "-"
        print(f"{c:>11} | {r or float('nan'):>13.1f} | {mine[c]:>17.1f} | {ratio}")
    print(
        f"weight reload ({reload['weights_mb']:.0f} MB): median {reload['reload_s_median']:.2f}s, "
        f"memcpy floor {reload['memcpy_floor_s']:.3f}s"
    )
    result = {
        "benchmark": "samplers_vllm",
        "model": args.model,
        "new_tokens": args.new_tokens,
        "prompt_tokens": args.prompt_tokens,
        "omp_threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
        "vllm": {
            str(c): {
                "raw_tok_s": raw.get(c),
                "sampler_tok_s": mine[c],
                "ratio": mine[c] / raw[c] if raw.get(c) else None,
            }
            for c in CONCURRENCY
        },
        "vllm_reload": reload,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
