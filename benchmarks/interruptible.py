"""What in-flight rows cost and get on a weight update: the hf sampler's ``on_update``
policies under a stream of weight updates.

    python benchmarks/interruptible.py [--model tiny-llama] [--update-every 8 32]
        [--callers 16] [--group 4] [--prompt-tokens 256] [--new-tokens 32 128]
        [--requests 3] [--lr 1e-6 1e-4] [--repeats 3] [--threads 1] [--out PATH]

Workload: `callers` concurrent callers, in groups of `group` that share a prompt of
`prompt-tokens` random tokens (a GRPO group); each caller samples `requests`
continuations one after the other, each of a length drawn uniformly from `new-tokens`
(temperature 1, no stop tokens, the same lengths and seeds for every policy). While they
run, new weights are published every `update-every` decode steps: w_v = w_(v-1) +
lr * sign(noise), about the size of one Adam step at learning rate `lr` (each `lr` is a
separate case: throughput does not depend on it, the log-prob gap of ``keep`` does).

Policies (``sampler.on_update``): ``none`` (no update at all: the throughput ceiling),
``keep`` (rows go on with the KV the old weights computed), ``reprefill`` (AReaL's
interruptible generation: each row's context is prefilled again under the new weights),
``drain`` (the update waits until the rows in flight finish; new requests wait for it).

Measured per policy (median over `repeats` runs, policies interleaved so machine load hits
all alike; the log-prob gap on the first run only): generated tokens per second of wall
time (updates included), updates applied
and how long one waited to be applied (drain holds it until the rows in flight finish),
tokens the sampler forwarded again per update (``stats()["reprefill_tokens"]``) and the
context tokens whose KV was recomputed (the rows' own count, shared prompts counted for
each row), and the log-prob gap: |sampler log-prob - a fresh forward of the same context
under the weights of the token's version|, over the tokens sampled after an update that
interrupted their request (``after``) and over all tokens (``all``; drain and none have
no interrupted tokens, their gap is the numerical floor). Writes
benchmarks/results/interruptible[_MODEL].json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

POLICIES = ("none", "keep", "reprefill", "drain")
GAP_KEYS = ("gap_all_mean", "gap_all_max", "gap_after_mean", "gap_after_max", "after_n")


def _delta(shapes: dict[str, Any], version: int, lr: float) -> dict[str, torch.Tensor]:
    """Version `version`'s step; tied weights (an alias names the key it shares storage
    with) get the same step, as they do in training."""
    g = torch.Generator().manual_seed(1000 + version)
    out: dict[str, torch.Tensor] = {}
    for k, s in shapes.items():
        out[k] = out[s] if isinstance(s, str) else lr * torch.randn(s, generator=g).sign()
    return out


def _shapes(model: Any) -> dict[str, Any]:
    """Each parameter's shape, or for a tied one the name of the first key sharing it."""
    first: dict[int, str] = {}
    out: dict[str, Any] = {}
    for k, v in model.state_dict().items():
        ptr = v.untyped_storage().data_ptr()
        if ptr in first:
            out[k] = first[ptr]
        else:
            first[ptr], out[k] = k, v.shape
    return out


async def run_once(
    model: Any, tok: Any, w0: dict[str, torch.Tensor], policy: str, args: argparse.Namespace
) -> dict[str, Any]:
    from agentrl.samplers import SamplingParams
    from agentrl.samplers.hf import HFSampler

    model.load_state_dict(w0)
    sampler = HFSampler(
        model,
        tok,
        max_batch_size=args.callers,
        on_update="keep" if policy == "none" else policy,
        default_stop_token_ids=(),
        seed=0,
    )
    rng = random.Random(0)
    prompts = [
        [rng.randrange(3, min(10_000, sampler.vocab_size)) for _ in range(args.prompt_tokens)]
        for _ in range(-(-args.callers // args.group))
    ]
    lo, hi = args.new_tokens
    plan = [[rng.randint(lo, hi) for _ in range(args.requests)] for _ in range(args.callers)]
    results: list[tuple[list[int], Any]] = []
    shapes = args.shapes
    master = {k: v.float().clone() for k, v in w0.items()}
    done = anyio.Event()
    updates = 0
    waits: list[float] = []  # publish -> applied: how long each update waited for the sampler

    async def caller(c: int) -> None:
        prompt = prompts[c // args.group]
        for i, n in enumerate(plan[c]):
            params = SamplingParams(temperature=1.0, max_new_tokens=n, seed=c * 1000 + i)
            results.append((prompt, await sampler.generate(prompt, params)))

    async def publisher() -> None:
        nonlocal updates
        mark = 0
        while not done.is_set():
            if sampler.stats()["steps"] - mark >= args.update_every:
                version = updates + 1
                for k, d in _delta(shapes, version, args.lr).items():
                    master[k] += d
                t = time.perf_counter()
                await sampler.update_weights(master, version)
                waits.append(time.perf_counter() - t)
                updates = version
                mark = sampler.stats()["steps"]
            await anyio.sleep(0.001)

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        if policy != "none":
            tg.start_soon(publisher)
        async with anyio.create_task_group() as callers:
            for c in range(args.callers):
                callers.start_soon(caller, c)
        done.set()
    wall = time.perf_counter() - t0
    stats = sampler.stats()
    await sampler.close()
    tokens = sum(len(g) for _, g in results)
    reprefilled = sum(g.metadata["reprefilled_tokens"] for _, g in results)
    gaps = _gaps(model, w0, results, updates, args) if args.gaps else dict.fromkeys(GAP_KEYS)
    return {
        "wall_s": wall,
        "tokens": tokens,
        "tok_s": tokens / wall,
        "updates": updates,
        "update_wait_s": statistics.mean(waits) if waits else None,
        "decode_steps": stats["steps"],
        "reprefill_forwarded_per_update": stats["reprefill_tokens"] / updates if updates else 0.0,
        "reprefill_s_per_update": stats["reprefill_s"] / updates if updates else 0.0,
        "reprefill_share_of_wall": stats["reprefill_s"] / wall,
        "reprefill_context_per_update": reprefilled / updates if updates else 0.0,
        "interrupted_tokens": gaps.pop("after_n"),  # None: not measured in this run
        **gaps,
    }


def _gaps(
    model: Any, w0: dict[str, torch.Tensor], results: list, updates: int, args: Any
) -> dict[str, Any]:
    """|sampler log-prob - fresh forward under the token's version|, all tokens and those
    sampled after an update interrupted their request."""
    master = {k: v.float().clone() for k, v in w0.items()}
    all_gaps: list[torch.Tensor] = []
    after: list[torch.Tensor] = []
    for version in range(updates + 1):
        if version:
            for k, d in _delta(args.shapes, version, args.lr).items():
                master[k] += d
        model.load_state_dict(master)
        for prompt, gen in results:
            at = torch.tensor([v == version for v in gen.versions])
            if not at.any():
                continue
            ids = torch.tensor([prompt + gen.token_ids])
            where = at.nonzero()[:, 0]
            with torch.inference_mode():  # the LM head only where this version sampled
                hidden = model.get_decoder()(input_ids=ids).last_hidden_state[0]
                logits = model.get_output_embeddings()(hidden[len(prompt) - 1 + where]).float()
            chosen = torch.tensor(gen.token_ids)[where]
            fresh = torch.log_softmax(logits, -1).gather(-1, chosen[:, None])[:, 0]
            gap = (torch.tensor(gen.logprobs)[where] - fresh).abs()
            all_gaps.append(gap)
            interrupted = torch.tensor([v != gen.versions[0] for v in gen.versions])[where]
            after.append(gap[interrupted])
    everything = torch.cat(all_gaps)
    late = torch.cat(after) if after else torch.zeros(0)
    return {
        "gap_all_mean": everything.mean().item(),
        "gap_all_max": everything.max().item(),
        "gap_after_mean": late.mean().item() if late.numel() else None,
        "gap_after_max": late.max().item() if late.numel() else None,
        "after_n": int(late.numel()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--dtype", default=None, help="default: the model's (bf16 for SmolLM2)")
    ap.add_argument("--update-every", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--callers", type=int, default=16)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, nargs=2, default=[32, 128])
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--lr", type=float, nargs="+", default=[1e-6, 1e-4])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    ap.add_argument(
        "--gap-policies",
        nargs="+",
        default=list(POLICIES),
        choices=POLICIES,
        help="policies whose log-prob gap is measured (a forward per token version)",
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    suffix = "" if args.model == "tiny-llama" else f"_{args.model}"
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"interruptible{suffix}.json")

    from agentrl.cpu import set_allocator
    from agentrl.models import load_model

    set_allocator("reuse")  # as a training run does
    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model, dtype=args.dtype)
    w0 = {k: v.clone() for k, v in model.state_dict().items()}
    args.shapes = _shapes(model)
    load_before = os.getloadavg()[0]
    print(
        f"{args.model} ({model.dtype}), {args.callers} callers in groups of {args.group}, "
        f"prompt {args.prompt_tokens} tokens, {args.requests} requests of "
        f"{args.new_tokens[0]}..{args.new_tokens[1]} tokens each, lr {args.lr}, "
        f"{args.threads} torch thread(s), load average {load_before:.1f}",
        flush=True,
    )

    async def run() -> dict[str, dict[str, list[dict[str, Any]]]]:
        warm = argparse.Namespace(**{**vars(args), "callers": 2, "requests": 1})
        warm.new_tokens, warm.update_every, warm.lr, warm.gaps = [4, 4], 2, 1e-4, True
        await run_once(model, tok, w0, "reprefill", warm)
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for lr in args.lr:
            for every in args.update_every:
                cfg = argparse.Namespace(**{**vars(args), "update_every": every, "lr": lr})
                case = runs[f"lr {lr:g}, every {every}"] = {p: [] for p in args.policies}
                for r in range(args.repeats):
                    for policy in args.policies:
                        # the gap is no timing: measured on the first repeat
                        cfg.gaps = r == 0 and policy in args.gap_policies
                        res = await run_once(model, tok, w0, policy, cfg)
                        case[policy].append(res)
                        print(
                            f"  lr {lr:g}, every {every:>3} steps, {policy:>9} #{r}: "
                            f"{res['tok_s']:7.1f} tok/s, {res['updates']} updates, "
                            f"gap after {res['gap_after_mean']}",
                            flush=True,
                        )
        return runs

    runs = anyio.run(run)
    summary: dict[str, dict[str, dict[str, Any]]] = {}
    for case, by_policy in runs.items():
        summary[case] = {}
        for policy, rs in by_policy.items():
            row: dict[str, Any] = {"tok_s": statistics.median(r["tok_s"] for r in rs)}
            for key in (
                "updates",
                "update_wait_s",
                "reprefill_forwarded_per_update",
                "reprefill_s_per_update",
                "reprefill_share_of_wall",
                "reprefill_context_per_update",
                "interrupted_tokens",
                "gap_all_mean",
                "gap_all_max",
                "gap_after_mean",
                "gap_after_max",
            ):
                values = [r[key] for r in rs if r[key] is not None]
                row[key] = statistics.median(values) if values else None
            summary[case][policy] = row
        base = summary[case].get("keep", {}).get("tok_s")
        for row in summary[case].values():
            row["tok_s_vs_keep"] = row["tok_s"] / base if base else None

    # throughput does not depend on lr: pool every run of an update interval
    throughput: dict[str, dict[str, dict[str, Any]]] = {}
    for every in args.update_every:
        pooled = {
            p: [
                r["tok_s"]
                for case, by in runs.items()
                if case.endswith(f"every {every}")
                for r in by[p]
            ]
            for p in args.policies
        }
        base = statistics.median(pooled["keep"]) if pooled.get("keep") else None
        throughput[str(every)] = {
            p: {
                "runs": len(v),
                "tok_s_median": statistics.median(v),
                "tok_s_min": min(v),
                "tok_s_max": max(v),
                "median_vs_keep": statistics.median(v) / base if base else None,
            }
            for p, v in pooled.items()
        }

    def f(x: Any, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    print(
        f"\n{'update every':>12} | {'policy':>9} | {'runs':>4} | tok/s median (min..max) | vs keep"
    )
    for every, by_policy in throughput.items():
        for policy, t in by_policy.items():
            print(
                f"{every:>12} | {policy:>9} | {t['runs']:>4} | {t['tok_s_median']:7.1f} "
                f"({t['tok_s_min']:6.1f}..{t['tok_s_max']:6.1f}) | {f(t['median_vs_keep'], '.2f')}"
            )

    print(
        f"\n{'case':>20} | {'policy':>9} | {'tok/s':>7} | {'vs keep':>7} | "
        f"{'updates':>7} | {'wait (s)':>8} | {'re-fed/upd':>10} | {'context/upd':>11} | "
        f"{'s/upd':>6} | {'% wall':>6} | "
        f"{'gap after mean / max':>22} | {'gap all mean':>12}"
    )
    for case, by_policy in summary.items():
        for policy, row in by_policy.items():
            print(
                f"{case:>20} | {policy:>9} | {row['tok_s']:7.1f} | "
                f"{f(row['tok_s_vs_keep'], '.2f'):>7} | {row['updates']:7.0f} | "
                f"{f(row['update_wait_s'], '.3f'):>8} | "
                f"{row['reprefill_forwarded_per_update']:10.0f} | "
                f"{row['reprefill_context_per_update']:11.0f} | "
                f"{row['reprefill_s_per_update']:6.3f} | {100 * row['reprefill_share_of_wall']:6.1f} | "
                f"{f(row['gap_after_mean'], '.1e'):>10} / {f(row['gap_after_max'], '.1e'):>9} | "
                f"{f(row['gap_all_mean'], '.1e'):>12}"
            )
    result = {
        "benchmark": "interruptible",
        "model": args.model,
        "dtype": str(model.dtype),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "shapes")},
        "cpu_count": os.cpu_count(),
        "loadavg_1m_before_after": [load_before, os.getloadavg()[0]],
        "throughput": throughput,
        "summary": summary,
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
