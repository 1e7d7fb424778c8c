"""The gateway's three chat APIs and forced tool calls, measured.

    .venv/bin/python benchmarks/gateway_apis.py [--samples 32] [--skip-model]

(1) Per-call cost of each API (chat completions, Anthropic Messages, OpenAI Responses):
    one gateway over a sampler that answers a fixed tool call at once, so the time is the
    gateway's own (HTTP, validation, conversion, rendering, recording); a fresh session per
    call, one call at a time, p50 / p95 after a warm-up.
(2) What forcing a tool call does on SmolLM2-135M-Instruct as it is: the calculator
    agent's prompt (examples/calculator_agent.py), arithmetic questions, ``--samples``
    replies at temperature 1 for ``tool_choice`` auto / required / the named function:
    how many replies hold a call the Hermes parser reads.

Writes benchmarks/results/gateway_apis.json with the machine and its load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from agentrl.gateway import Gateway, GatewayServer, GatewaySettings  # noqa: E402
from agentrl.gateway.protocol import ChatCompletionRequest  # noqa: E402
from agentrl.models import load_model  # noqa: E402
from agentrl.samplers import Generation, Sampler, SamplingParams, create_sampler  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
QUESTIONS = [
    "What is 17 + 25?",
    "Compute 9 * 13.",
    "What is 144 / 12?",
    "What is 73 - 48?",
    "Compute (6 + 4) * 3.",
    "What is 2 ** 10?",
    "What is 81 - 19 + 7?",
    "Compute 56 / 7 + 3.",
]
CALL = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2+3"}}\n</tool_call>'
SCHEMA = {"type": "object", "properties": {"expression": {"type": "string"}}}


class FixedReply(Sampler):
    """Answers the same tool call at once: what is left of a call is the gateway's cost."""

    backend = "fixed"

    def __init__(self, inner: Sampler) -> None:
        self.inner = inner

    @property
    def version(self) -> int:
        return 0

    @property
    def context_length(self) -> int | None:
        return self.inner.context_length

    @property
    def vocab_size(self) -> int:
        return self.inner.vocab_size

    @property
    def tokenizer(self) -> Any:
        return self.inner.tokenizer

    async def generate(self, prompt_ids: Any, params: SamplingParams) -> Generation:
        ids = list(self.tokenizer.encode(CALL + "<|im_end|>", add_special_tokens=False))
        return Generation(ids, [-0.5] * len(ids), [0] * len(ids), "stop")

    async def update_weights(self, weights: Any, version: int) -> None:
        pass


def _request(api: str, i: int) -> tuple[str, dict[str, Any]]:
    question = [{"role": "user", "content": f"question {i}"}]
    if api == "chat":
        tool = {"type": "function", "function": {"name": "calculate", "parameters": SCHEMA}}
        return "/v1/chat/completions", {"model": "m", "messages": question, "tools": [tool]}
    if api == "messages":
        tool = {"name": "calculate", "input_schema": SCHEMA}
        return "/v1/messages", {
            "model": "m",
            "max_tokens": 64,
            "messages": question,
            "tools": [tool],
        }
    tool = {"type": "function", "name": "calculate", "parameters": SCHEMA}
    return "/v1/responses", {"model": "m", "input": question, "tools": [tool]}


async def api_latency(calls: int) -> dict[str, Any]:
    import httpx

    inner = create_sampler("hf", model=load_model("tiny-llama", dtype="float32"), seed=0)
    server = GatewayServer(Gateway(FixedReply(inner), GatewaySettings(max_new_tokens=64)))
    gateway = server.gateway
    await server.start()
    out: dict[str, Any] = {}
    try:
        async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60) as http:
            for api in ("chat", "messages", "responses"):
                times = []
                for i in range(calls + 50):
                    session = gateway.open_session()
                    path, body = _request(api, i)
                    t0 = time.perf_counter()
                    r = await http.post(path, json=body, headers={"x-api-key": session.key})
                    times.append(time.perf_counter() - t0)
                    if r.status_code != 200:
                        raise RuntimeError(f"{api}: {r.status_code} {r.text}")
                    gateway.close_session(session.key)
                kept = sorted(times[50:])
                out[api] = {
                    "calls": len(kept),
                    "p50_ms": 1000 * statistics.median(kept),
                    "p95_ms": 1000 * kept[int(0.95 * (len(kept) - 1))],
                }
    finally:
        await server.close()
    return out


async def forcing(samples: int) -> dict[str, Any]:
    from calculator_agent import SYSTEM, TOOLS

    model = load_model("smollm2-135m-instruct", dtype="float32")
    sampler = create_sampler("hf", model=model, max_batch_size=32, seed=0)
    gateway = Gateway(sampler, GatewaySettings(max_new_tokens=64, temperature=1.0))
    named = {"type": "function", "function": {"name": "calculate"}}
    out: dict[str, Any] = {}
    for mode, choice in (("auto", "auto"), ("required", "required"), ("named", named)):
        t0 = time.perf_counter()

        async def one(i: int, choice: Any = choice) -> list[Any]:
            session = gateway.open_session(seed=i)
            messages = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]},
            ]
            req = ChatCompletionRequest(
                model="m", messages=messages, tools=TOOLS, tool_choice=choice, n=4, seed=i
            )
            done = await gateway.chat(session, req)
            gateway.close_session(session.key)
            return done.replies

        replies = [
            r for rs in await asyncio.gather(*[one(i) for i in range(samples // 4)]) for r in rs
        ]
        parsed = [r for r in replies if r.tool_calls]
        out[mode] = {
            "replies": len(replies),
            "parsed_calls": len(parsed),
            "calls_to_calculate": sum(
                r.tool_calls[0]["function"]["name"] == "calculate" for r in parsed
            ),
            "seconds": round(time.perf_counter() - t0, 1),
            "examples": [r.text[:160] for r in replies[:4]],
        }
        print(mode, f"{len(parsed)}/{len(replies)} parsed calls", flush=True)
    await sampler.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--skip-model", action="store_true", help="only the API latencies")
    parser.add_argument("--out", type=Path, default=RESULTS / "gateway_apis.json")
    args = parser.parse_args()
    result: dict[str, Any] = {"api_latency": asyncio.run(api_latency(args.calls))}
    for api, row in result["api_latency"].items():
        print(f"{api}: p50 {row['p50_ms']:.2f} ms, p95 {row['p95_ms']:.2f} ms")
    if not args.skip_model:
        result["forcing_smollm2"] = asyncio.run(forcing(args.samples))
    result["machine"] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
