"""Decode throughput, measured the same way by every hf-sampler benchmark (gpu.py,
samplers.py, sampler_overhead.py): one batched ``model.generate`` over `c` copies of a
prompt, or `c` concurrent callers of an agentrl sampler, in generated tokens per second.

No imports of agentrl at module level and no ``sys.path`` changes: sampler_overhead.py's
child process imports this beside an older revision's agentrl."""

from __future__ import annotations

import time
from typing import Any

import anyio
import torch


def generate_tok_s(model: Any, prompt: list[int], c: int, new_tokens: int) -> float:
    """Tokens/s of one batched model.generate call over `c` copies of the prompt, sampling
    exactly `new_tokens` each (temperature 1, no truncation), on the model's device."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt] * c, device=device)
    _sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=0,
        )
    _sync(device)
    return out.shape[0] * (out.shape[1] - len(prompt)) / (time.perf_counter() - t0)


async def sampler_tok_s(sampler: Any, prompt: list[int], c: int, new_tokens: int) -> float:
    """Tokens/s of `c` concurrent ``sampler.generate`` calls on the prompt (temperature 1,
    at most `new_tokens` each)."""
    from agentrl.samplers import SamplingParams

    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
    counts: list[int] = []

    async def one() -> None:
        counts.append(len(await sampler.generate(prompt, params)))

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(c):
            tg.start_soon(one)
    return sum(counts) / (time.perf_counter() - t0)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
