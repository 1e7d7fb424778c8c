"""DPO on SmolLM2-135M with a preference set the project makes from its own rollouts.

    nice -n 10 python benchmarks/preference_dpo.py                 # the defaults below
    python benchmarks/preference_dpo.py --model tiny-llama --train-groups 4 --eval-groups 2

1. Pairs: code_math tasks (configs/dpo_code_math.yaml with ``--generators``, default
   chain_sum, where SmolLM2-135M is right about half the time so most groups have a right
   and a wrong answer; the ```python call format, temperature 1) are rolled out in groups
   of ``--group-size``; each
   group's best episode (a correct answer) against its worst (an incorrect one) is a pair,
   groups whose rewards are all equal are ties and skipped (agentrl.preference.rollouts).
   Train pairs come from the train split, held-out pairs from the eval split.
2. ``agentrl dpo``'s trainer (DPO, beta 0.1) trains on the train pairs with their reference
   log-probs computed once.
3. Measured before and after: held-out preference accuracy (the share of held-out pairs
   whose chosen episode has the higher implicit reward beta log pi/pi_ref; before training
   every margin is 0, so the log-prob preference log pi(y_w) > log pi(y_l) and its
   per-token version are reported too), and the task reward on the eval split's tasks
   (the same tasks, sampled again with the trained weights published to the sampler).

The episode timeout is raised to ``--episode-timeout`` (default 1 hour): on a loaded machine
a batched episode can outlast the config's 300 s, and a timed-out episode is an
``infra_error`` that forms no pair (the first shared-machine run lost every train episode
that way). The JSON is rewritten after every stage (``"stage"`` says how far it got), with
the episode statuses per split.

Prints a table and writes benchmarks/results/preference_dpo[_MODEL][TAG].json; with
``--pairs-out`` the train pairs too (token ids and loss masks, JSONL), which
benchmarks/dpo_vs_trl.py can time both trainers on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from pathlib import Path

import anyio
import torch

from agentrl.config import load_config
from agentrl.devices import resolve_device
from agentrl.models import load_model
from agentrl.preference.rollouts import pairs_from_groups
from agentrl.preference.trainer import PreferenceTrainer
from agentrl.run.components import build_engine
from agentrl.run.runtime import assemble
from agentrl.run.settings import preference_settings
from agentrl.weights import WeightBus

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def mean_reward(groups: list) -> float | None:
    """Mean reward of the episodes that ran (``infra_error`` ones excluded); None if none did."""
    rewards = [t.reward for g in groups for t in g.valid()]
    return sum(rewards) / len(rewards) if rewards else None


def logp_preference(trainer: PreferenceTrainer, pairs: list) -> dict[str, float]:
    """Shares of pairs where the policy gives y_w the higher log-prob (sum, per token)."""
    if not pairs:
        return {}
    with torch.no_grad():
        rows = [p.chosen for p in pairs] + [p.rejected for p in pairs]
        logps, lengths = [], []
        for i in range(0, len(rows), 8):
            lp, n = trainer.sequence_logps(rows[i : i + 8])
            logps.append(lp)
            lengths.append(n)
        lp, n = torch.cat(logps), torch.cat(lengths)
    k = len(pairs)
    return {
        "logp_accuracy": float((lp[:k] > lp[k:]).float().mean()),
        "logp_per_token_accuracy": float((lp[:k] / n[:k] > lp[k:] / n[k:]).float().mean()),
    }


async def main(args: argparse.Namespace, out: Path) -> dict:
    overrides = [f"model.name={args.model}", f"rollout.group_size={args.group_size}"]
    overrides += [f"learner.lr={args.lr}", f"preference.beta={args.beta}"]
    overrides += [f"preference.batch_size={args.batch_size}", f"orchestrator.seed={args.seed}"]
    overrides += [f"rollout.episode_timeout_s={args.episode_timeout}"]
    overrides += [f"sampler.temperature={args.temperature}"]
    overrides += [f"env.options.generators=[{','.join(args.generators)}]"]
    if args.model == "tiny-llama":
        overrides += ["model.dtype=float32", "learner.fused_logprobs=off"]
    cfg = load_config(ROOT / "configs" / "dpo_code_math.yaml", overrides)
    bs = cfg.preference.batch_size
    result: dict = {
        "what": "DPO on pairs from the project's own code_math rollouts (best vs worst of a group)",
        "stage": "started",
        "model": args.model,
        "config": "configs/dpo_code_math.yaml",
        "overrides": overrides,
        "generators": args.generators,
        "temperature": args.temperature,
        "loss": "dpo",
        "beta": args.beta,
        "lr": args.lr,
        "epochs": args.epochs,
        "batch_size": bs,
        "group_size": args.group_size,
        "train_groups": args.train_groups,
        "eval_groups": args.eval_groups,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, shared with other jobs (nice 10)",
        "torch_threads": torch.get_num_threads(),
    }
    timings: dict[str, float] = {}
    result["timings_s"] = timings

    def save(stage: str) -> None:
        result["stage"] = stage
        result["peak_rss_mb"] = _peak_rss_mb()
        out.write_text(json.dumps(result, indent=1))
        print(f"[{stage}] wrote {out}", flush=True)

    save("started")
    t0 = time.perf_counter()
    train_run = await anyio.to_thread.run_sync(lambda: assemble(cfg, "rollout"))
    async with train_run:
        train_groups = await train_run.engine.collect(args.train_groups)
    del train_run
    timings["rollout_train_s"] = time.perf_counter() - t0
    train_pairs, train_ties = pairs_from_groups(train_groups)
    result |= {
        "train_pairs": len(train_pairs),
        "train_ties": train_ties,
        "train_reward": mean_reward(train_groups),
        "train_status": _statuses(train_groups),
        "mean_tokens_per_pair": sum(
            len(p.chosen.input_ids) + len(p.rejected.input_ids) for p in train_pairs
        )
        / max(len(train_pairs), 1),
    }
    if args.pairs_out:
        write_pairs(Path(args.pairs_out), train_pairs)
        result["pairs_file"] = str(args.pairs_out)
    save("rollout_train")
    t0 = time.perf_counter()
    eval_run = await anyio.to_thread.run_sync(lambda: assemble(cfg, "rollout", split="eval"))
    async with eval_run:
        eval_groups = await eval_run.engine.collect(args.eval_groups)
        timings["rollout_eval_before_s"] = time.perf_counter() - t0
        held_out, eval_ties = pairs_from_groups(eval_groups)
        result |= {
            "held_out_pairs": len(held_out),
            "held_out_ties": eval_ties,
            "task_reward_before": mean_reward(eval_groups),
            "eval_status": _statuses(eval_groups),
        }
        save("rollout_eval_before")
        if not train_pairs:
            raise SystemExit(
                f"no train pairs formed (statuses {result['train_status']}): see {out}"
            )
        device = resolve_device(cfg.learner.device, "learner.device")
        model, tok = await anyio.to_thread.run_sync(
            lambda: load_model(cfg.model.name, dtype="float32", device=device, seed=cfg.model.seed)
        )
        trainer = PreferenceTrainer(model, preference_settings(cfg), device, tok.pad_token_id or 0)
        t0 = time.perf_counter()
        ref_train = await anyio.to_thread.run_sync(trainer.reference_logps, train_pairs, bs)
        ref_eval = await anyio.to_thread.run_sync(trainer.reference_logps, held_out, bs)
        timings["reference_s"] = time.perf_counter() - t0
        before = await anyio.to_thread.run_sync(trainer.evaluate, held_out, ref_eval, bs)
        before |= await anyio.to_thread.run_sync(logp_preference, trainer, held_out)
        result["held_out_before"] = before
        save("reference")
        rng = random.Random(args.seed)
        steps: list[dict] = []
        result["steps"] = steps
        train_s = 0.0
        for epoch in range(args.epochs):
            order = list(range(len(train_pairs)))
            rng.shuffle(order)
            t0 = time.perf_counter()
            for i in range(0, len(order), bs):
                index = order[i : i + bs]
                batch = [train_pairs[j] for j in index]
                values = await anyio.to_thread.run_sync(trainer.step, batch, ref_train[index])
                steps.append({k: round(v, 5) for k, v in values.items()})
                print(
                    f"step {len(steps)}: loss {values['loss']:.4f} margin {values['rewards/margin']:.3f}",
                    flush=True,
                )
            train_s += time.perf_counter() - t0
            timings["train_s"] = train_s
            result["pairs_per_s"] = len(train_pairs) * (epoch + 1) / train_s
            save(f"epoch_{epoch + 1}")
        after = await anyio.to_thread.run_sync(trainer.evaluate, held_out, ref_eval, bs)
        after |= await anyio.to_thread.run_sync(logp_preference, trainer, held_out)
        result["held_out_after"] = after
        save("held_out_after")
        bus = WeightBus()
        bus.register(eval_run.sampler)
        await bus.publish(1, trainer.model)
        t0 = time.perf_counter()
        engine = build_engine(cfg, eval_run.env, eval_run.sampler, split="eval")
        after_groups = await engine.collect(args.eval_groups)
        timings["rollout_eval_after_s"] = time.perf_counter() - t0
    result |= {
        "task_reward_after": mean_reward(after_groups),
        "eval_after_status": _statuses(after_groups),
    }
    save("done")
    return result


def write_pairs(path: Path, pairs: list) -> None:
    """The pairs as token ids and loss masks, one JSON object a line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for p in pairs:
            row = {
                "chosen_ids": p.chosen.input_ids,
                "chosen_mask": p.chosen.loss_mask,
                "rejected_ids": p.rejected.input_ids,
                "rejected_mask": p.rejected.loss_mask,
                "where": p.where,
            }
            f.write(json.dumps(row) + "\n")


def _statuses(groups: list) -> dict[str, int]:
    """Episodes by status (an infra_error group forms no pair and counts as a tie)."""
    counts: dict[str, int] = {}
    for g in groups:
        for t in g.trajectories:
            counts[t.status] = counts.get(t.status, 0) + 1
    return counts


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cli() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--train-groups", type=int, default=24)
    p.add_argument("--eval-groups", type=int, default=16)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--generators", nargs="+", default=["chain_sum"])
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--episode-timeout", type=float, default=3600.0)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tag", default="", help="suffix of the result file name")
    p.add_argument("--pairs-out", default="", help="also write the train pairs (JSONL) here")
    args = p.parse_args()
    suffix = ("" if args.model == "smollm2-135m-instruct" else f"_{args.model}") + args.tag
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"preference_dpo{suffix}.json"
    result = anyio.run(main, args, out)
    b, a = result["held_out_before"], result["held_out_after"]
    print(
        f"pairs: {result['train_pairs']} train ({result['train_ties']} ties), {result['held_out_pairs']} held out"
    )
    for key in ("accuracy", "logp_accuracy", "logp_per_token_accuracy", "loss"):
        if key in b:
            print(f"held-out {key:24s} {b[key]:.3f} -> {a[key]:.3f}")
    print(
        f"task reward (eval split)         {result['task_reward_before']} -> {result['task_reward_after']}"
    )
    print(
        f"pairs/s {result['pairs_per_s']:.3f}; peak RSS {result['peak_rss_mb']:.0f} MB; wrote {out}"
    )


if __name__ == "__main__":
    cli()
