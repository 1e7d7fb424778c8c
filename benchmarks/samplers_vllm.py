"""Tokens/s of the vllm sampler beside raw ``vllm.LLM.generate``, and weight-reload time.

Run in .venv-vllm: ``.venv-vllm/bin/python benchmarks/samplers_vllm.py``.
Both engines get the same engine arguments and the same work: a fixed prompt, fixed-length
outputs (ignore_eos), temperature 1, the sampled token's log-prob. Both engines stay up
and the measurements alternate (raw, ours; best of --repeats), so a change in machine load
hits both alike. Prints a table, writes JSON, and prints ONE final
JSON line (merged by benchmarks/samplers.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

CONCURRENCY = (1, 8, 32)


def start_raw_engine(engine_args):
    from vllm import LLM

    return LLM(**{k: getattr(engine_args, k) for k in _LLM_KEYS})


_LLM_KEYS = (
    "model", "dtype", "max_model_len", "max_num_seqs", "logprobs_mode", "max_logprobs",
    "enforce_eager", "seed",
)  # fmt: skip


def raw_once(llm, prompt, c, new_tokens):
    """Tokens/s of vllm.LLM.generate on a batch of `c` identical requests."""
    from vllm import SamplingParams as VParams
    from vllm.inputs import TokensPrompt

    params = VParams(temperature=1.0, max_tokens=new_tokens, ignore_eos=True, logprobs=0, seed=0)
    t0 = time.perf_counter()
    res = llm.generate([TokensPrompt(prompt_token_ids=prompt)] * c, params, use_tqdm=False)
    return sum(len(r.outputs[0].token_ids) for r in res) / (time.perf_counter() - t0)


async def ours_once(sampler, prompt, c, new_tokens):
    """Tokens/s of `c` concurrent VLLMSampler.generate callers."""
    import anyio

    from agentrl.samplers.base import SamplingParams

    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=0)
    counts = []

    async def one(i):
        counts.append(len(await sampler.generate(prompt, params.with_(seed=i))))

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(c):
            tg.start_soon(one, i)
    return sum(counts) / (time.perf_counter() - t0)


async def run(args, sampler, prompt):
    """Both engines alive; measurements interleaved (raw, ours) so load drift hits both."""
    import anyio
    from safetensors.torch import load_file

    await sampler.start()
    sampler.ignore_eos = True
    llm = (
        None
        if args.skip_raw
        else await anyio.to_thread.run_sync(start_raw_engine, sampler.engine_args())
    )
    raw: dict[int, float] = {}
    mine: dict[int, float] = {}
    if llm is not None:
        await anyio.to_thread.run_sync(raw_once, llm, prompt, 1, 8)  # warm-up
    await ours_once(sampler, prompt, 1, 8)
    for c in CONCURRENCY:
        for _ in range(args.repeats):
            if llm is not None:
                r = await anyio.to_thread.run_sync(raw_once, llm, prompt, c, args.new_tokens)
                raw[c] = max(raw.get(c, 0.0), r)
            m = await ours_once(sampler, prompt, c, args.new_tokens)
            mine[c] = max(mine.get(c, 0.0), m)
        print(f"  c={c:<3} raw {raw.get(c, float('nan')):8.1f} tok/s   ours {mine[c]:8.1f} tok/s",
              flush=True)  # fmt: skip
    if llm is not None:
        llm.llm_engine.engine_core.shutdown()

    weights = load_file(str(sampler.model_dir / "model.safetensors"))
    nbytes = sum(t.numel() * t.element_size() for t in weights.values())
    reloads, copies = [], []
    for i in range(args.reloads):
        await sampler.update_weights(weights, sampler.version + 1)
        reloads.append(sampler.last_update_seconds)
        t0 = time.perf_counter()
        for v in weights.values():
            v.clone()
        copies.append(time.perf_counter() - t0)
        print(f"  reload {i}: {reloads[-1]:.2f}s (memcpy floor {copies[-1]:.3f}s)", flush=True)
    await sampler.close()
    return (
        raw,
        mine,
        {
            "reload_s_median": statistics.median(reloads),
            "reload_s_all": reloads,
            "memcpy_floor_s": statistics.median(copies),
            "weights_mb": nbytes / 2**20,
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--reloads", type=int, default=3)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--out", default="benchmarks/results/samplers_vllm.json")
    parser.add_argument("--repeats", type=int, default=2, help="best of N per concurrency")
    parser.add_argument("--skip-raw", action="store_true")
    args = parser.parse_args()

    import anyio

    from agentrl.samplers.vllm import VLLMSampler
    from agentrl.samplers.vllm_cpu import configure_cpu_env

    configure_cpu_env()
    sampler = VLLMSampler(args.model, dtype=args.dtype, max_model_len=1024, max_batch_size=32)
    prompt = sampler.tokenizer("Write a short story about a robot who learns to paint.")[
        "input_ids"
    ]
    prompt = (prompt * (args.prompt_tokens // len(prompt) + 1))[: args.prompt_tokens]
    print(
        f"vllm benchmark: {args.model}, {args.prompt_tokens} prompt + {args.new_tokens} new "
        f"tokens, OMP bind {os.environ.get('VLLM_CPU_OMP_THREADS_BIND')}",
        flush=True,
    )
    raw, mine, reload = anyio.run(run, args, sampler, prompt)

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
        "load_average_1min": os.getloadavg()[0],
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
