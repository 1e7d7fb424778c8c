"""Benchmark of `agentrl serve --tinker` (not tinker.py: that name would shadow the SDK):
requests/s through the official SDK, and the memory
each extra training client adds on one shared base model.

    python benchmarks/tinker_server.py                          # tiny-llama (seconds)
    python benchmarks/tinker_server.py --model smollm2-135m-instruct --clients 4

1. Training: one client's forward_backward + optim_step pairs per second on a fixed batch
   (8 sequences x 64 tokens), then the same with --clients clients submitting at once.
2. Sampling: sample requests per second (1 sample, 16 new tokens), from one client and from
   --clients clients (different adapters) at once: the server decodes queued requests of
   all adapters in one batch, so the aggregate rate grows with clients.
3. Memory: the server process's RSS after loading the base model, then after each extra
   client (created, one step taken so its AdamW moments exist); per extra client against
   the base model's size. LoRA rank --rank on every linear layer (Tinker's default targets).

The server runs in this process (a thread); the clients are the real SDK. Prints a table
and writes benchmarks/results/tinker_<model>.json.

    --placement ray    the engine in a Ray actor (orchestrator.backend: ray)
    --sampler vllm     sampling through vLLM's multi-LoRA (run it in .venv-vllm)
    --placement fsdp   two ranks, the base model sharded (learner.world_size: 2), ddp: whole
                       copies; memory is then the RSS of every engine process together
(results: tinker_<model>_<placement>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def _rss_mb(pids: list[int] | None = None) -> float:
    """RSS of `pids` together (this process when None)."""
    total = 0.0
    for pid in pids or ["self"]:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) / 1024
    return total


def _batch(tokenizer: Any, n: int, length: int) -> list[Any]:
    from tinker import types

    ids = (tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 20))[: length + 1]
    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(ids[:-1]),
            loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * length},
        )
        for _ in range(n)
    ]


def _train_rate(clients: list[Any], data: list[Any], steps: int) -> float:
    from tinker import types

    def run(client: Any) -> None:
        for _ in range(steps):
            fb = client.forward_backward(data, "cross_entropy")
            client.optim_step(types.AdamParams(learning_rate=1e-4)).result()
            fb.result()

    start = time.perf_counter()
    threads = [threading.Thread(target=run, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 2 * steps * len(clients) / (time.perf_counter() - start)  # requests/s


def _sample_rate(samplers: list[Any], prompt: list[int], per_client: int) -> float:
    from tinker import types

    params = types.SamplingParams(max_tokens=16, temperature=1.0, stop=[])
    start = time.perf_counter()
    futures = [
        s.sample(types.ModelInput.from_ints(prompt), 1, params)
        for _ in range(per_client)
        for s in samplers
    ]
    for f in futures:
        f.result()
    return len(futures) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--samples", type=int, default=16, help="sample requests per client")
    parser.add_argument("--placement", choices=["local", "ray", "fsdp", "ddp"], default="local")
    parser.add_argument(
        "--sampler", choices=["hf", "vllm"], default="hf", help="vllm: run in .venv-vllm"
    )
    parser.add_argument("--out", type=Path, help="the JSON file (default: by model and placement)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    import tinker

    from agentrl.config import load_config
    from agentrl.run.tinker.placement import open_server_from_config

    state = Path(tempfile.mkdtemp(prefix="tinker-bench-"))
    rss_start = _rss_mb()
    overrides = [f"model.name={args.model}", "model.dtype=float32", "learner.device=cpu"]
    overrides += {
        "local": [],
        "ray": ["orchestrator.backend=ray", "ray.num_cpus=2", "ray.learner.num_cpus=1"],
        "fsdp": ["learner.world_size=2", "learner.parallel=fsdp"],
        "ddp": ["learner.world_size=2", "learner.parallel=ddp"],
    }[args.placement]
    if args.sampler == "vllm":
        overrides += ["sampler.backend=vllm", "sampler.options.max_model_len=512"]
    server = open_server_from_config(load_config(overrides=overrides), state)
    engine = server.service.engine
    pids = engine.pids
    base_mb = engine.base_bytes() / 2**20
    rss_base = _rss_mb(pids)
    service = tinker.ServiceClient(base_url=server.url, api_key="tml-bench")
    name = engine.base_model
    clients, rss_clients = [], []
    for i in range(args.clients):
        client = service.create_lora_training_client(
            base_model=name, rank=args.rank, seed=i
        ).result()
        clients.append(client)
    tokenizer = clients[0].get_tokenizer()
    data = _batch(tokenizer, 8, 64)
    for client in clients:  # one step each: the AdamW moments exist from here on
        _train_rate([client], data, 1)
        rss_clients.append(_rss_mb(pids))
    adapter = engine.adapter_state(clients[0].model_id)
    adapter_mb = sum(t.numel() * t.element_size() for t in adapter.values()) / 2**20
    one_train = _train_rate(clients[:1], data, args.steps)
    all_train = _train_rate(clients, data, args.steps)
    samplers = [c.save_weights_and_get_sampling_client().result() for c in clients]
    prompt = tokenizer.encode("Once upon a time")
    _sample_rate(samplers[:1], prompt, 2)  # warm
    one_sample = _sample_rate(samplers[:1], prompt, args.samples)
    batches_before = len(server.service.futures.batches)
    all_sample = _sample_rate(samplers, prompt, args.samples)
    sizes = server.service.futures.batches[batches_before:]
    per_client = (rss_clients[-1] - rss_clients[0]) / max(1, len(rss_clients) - 1)
    result = {
        "model": args.model,
        "placement": f"{args.placement}: {engine.placement}",
        "sampler": args.sampler,
        "base_params_mb_in_first_engine_process": round(base_mb, 1),
        "lora_rank": args.rank,
        "adapter_params_mb": round(adapter_mb, 2),
        "adapter_plus_grad_plus_adam_mb": round(4 * adapter_mb, 2),
        "rss_mb": {
            "before_server": round(rss_start),
            "base_loaded": round(rss_base),
            "after_each_client": [round(r) for r in rss_clients],
        },
        "rss_per_extra_client_mb": round(per_client, 1),
        "train_requests_per_s": {
            "1 client": round(one_train, 2),
            f"{args.clients} clients": round(all_train, 2),
        },
        "sample_requests_per_s": {
            "1 client": round(one_sample, 2),
            f"{args.clients} clients": round(all_sample, 2),
        },
        "sample_batch_sizes_many_clients": {
            "mean": round(sum(sizes) / max(1, len(sizes)), 2),
            "max": max(sizes, default=0),
        },
        "batch": "8 x 64 tokens (train); 1 x 16 new tokens (sample)",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}",
    }
    server.close()
    suffix = "" if args.placement == "local" else f"_{args.placement}"
    suffix += "" if args.sampler == "hf" else f"_{args.sampler}"
    out = args.out or RESULTS / f"tinker_{args.model.replace('/', '_')}{suffix}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"| measure | {args.model} |\n|---|---|")
    print(f"| base model params | {base_mb:.1f} MB |")
    print(
        f"| adapter (rank {args.rank}) params / +grad+AdamW | {adapter_mb:.2f} / {4 * adapter_mb:.2f} MB |"
    )
    print(f"| RSS per extra client | {per_client:.1f} MB |")
    print(f"| train requests/s, 1 / {args.clients} clients | {one_train:.2f} / {all_train:.2f} |")
    print(
        f"| sample requests/s, 1 / {args.clients} clients | {one_sample:.2f} / {all_sample:.2f} |"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
