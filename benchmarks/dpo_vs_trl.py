"""agentrl dpo vs Hugging Face TRL's DPOTrainer: pairs/s and peak memory, side by side.

The same preference pairs (token ids), the same model (SmolLM2-135M-Instruct from the same
safetensors files), the same lengths and batch, in one run:

- pairs: by default ``benchmarks/results/preference_dpo_pairs.jsonl``, the train pairs of the
  SmolLM2 measurement (benchmarks/preference_dpo.py ``--pairs-out``: each code_math group's
  correct episode against an incorrect one, multi-turn with the python tool's output);
  ``--pairs FILE`` another such file; ``--synthetic P C`` seeded random pairs with a
  P-token prompt and two C-token answers (no file needed). A pair's prompt is the token
  prefix its two sides share; the loss covers every token after it, on both sides (TRL's
  ``completion_mask``; agentrl gets the same mask), so both train the same tokens;
- DPO (sigmoid), beta 0.1, ``--batch-size`` pairs a step (chosen and rejected in one
  forward on both sides), the batches in the file's order (TRL
  ``train_sampling_strategy="sequential"``), AdamW with agentrl's defaults (betas 0.9/0.999,
  no weight decay), constant learning rate, gradient clip 1, float32 (TRL's DPOConfig
  defaults to ``bf16=True``, autocast: set off here), no gradient
  checkpointing on either side (TRL's DPOConfig turns it on by default; ``trl+gc`` adds
  that configuration);
- reference log-probs computed once before training on both sides (agentrl always does; TRL
  ``precompute_ref_log_probs=True``), not timed. ``trl-ref`` is TRL's default instead: a
  frozen copy of the model forwarded at every step.

Configurations, each a fresh process (TRL in its own venv, ``.venv-trl``, made by
scripts/setup_trl.sh, which this script runs; nothing of agentrl is imported there):
``agentrl``, ``trl``, ``trl-ref``, ``trl+gc``. Rounds are interleaved (every
configuration once per round, the order rotated) so that the machine's load hits all of
them; each round's ratio to agentrl is reported and the median round is the figure.
Timing covers steps 2..N (model load, reference pass and the first step left out).
Memory: peak RSS (and PSS at the RSS peaks) of the process, sampled every 0.25 s up to the
last measured step (benchmarks/vs_trl.py's ``TreeMemory``). The losses of every step are
recorded on both sides: same pairs, same reference and same optimizer give the same losses
(up to float32 summation order), which shows that both ran the same workload.

    nice -n 10 .venv/bin/python benchmarks/dpo_vs_trl.py [--steps 4] [--rounds 2]
        [--batch-size 2] [--configs agentrl trl trl-ref] [--synthetic 192 64]

Prints a table and writes benchmarks/results/dpo_vs_trl.json (``<out>.tmp`` after every run).
This module is also the child process of each configuration (``--child``); its top level
imports nothing outside the standard library, so the TRL venv runs it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAIRS = ROOT / "benchmarks" / "results" / "preference_dpo_pairs.jsonl"
CONFIGS = ["agentrl", "trl", "trl-ref", "trl+gc"]
BETA = 0.1

# --- shared by both sides -------------------------------------------------------------------


def load_pairs(args: argparse.Namespace) -> list[dict[str, list[int]]]:
    """``steps * batch_size`` pairs as ``{prompt_ids, chosen_ids, rejected_ids}``."""
    need = args.steps * args.batch_size
    if args.synthetic:
        prompt_len, answer_len = args.synthetic
        rng = random.Random(0)
        vocab = (100, 49_000)  # SmolLM2's ordinary tokens (no special ids)
        rows = [
            {
                "prompt_ids": [rng.randrange(*vocab) for _ in range(prompt_len)],
                "chosen_ids": [rng.randrange(*vocab) for _ in range(answer_len)],
                "rejected_ids": [rng.randrange(*vocab) for _ in range(answer_len)],
            }
            for _ in range(need)
        ]
        return rows
    path = Path(args.pairs)
    if not path.is_file():
        raise SystemExit(
            f"--pairs {path}: no such file; write it with benchmarks/preference_dpo.py "
            "--pairs-out, or use --synthetic PROMPT_LEN ANSWER_LEN"
        )
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        raw = json.loads(line)
        try:
            w, r = raw["chosen_ids"], raw["rejected_ids"]
        except KeyError as e:
            raise SystemExit(
                f"{path}:{n}: missing field {e}; rows need chosen_ids and rejected_ids"
            ) from None
        k = 0
        while k < min(len(w), len(r)) and w[k] == r[k]:
            k += 1
        if k == 0 or k == len(w) or k == len(r):
            raise SystemExit(
                f"{path}:{n}: chosen and rejected share no prompt or one contains the other"
            )
        rows.append({"prompt_ids": w[:k], "chosen_ids": w[k:], "rejected_ids": r[k:]})
    if len(rows) < need:
        raise SystemExit(
            f"--pairs {path}: {len(rows)} pairs, {need} needed for --steps {args.steps} x "
            f"--batch-size {args.batch_size}"
        )
    return rows[:need]


# --- the TRL child --------------------------------------------------------------------------


def child_trl(args: argparse.Namespace, pairs: list[dict]) -> dict[str, Any]:
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    class TokenIdsDPOTrainer(DPOTrainer):
        """TRL tokenizes text rows itself; given token ids already, it keeps them (its
        collator reads prompt_ids / chosen_ids / rejected_ids, as after its own step)."""

        def _prepare_dataset(self, dataset: Any, *a: Any, **kw: Any) -> Any:
            return dataset

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    step_end: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *_: Any, **__: Any) -> None:
            step_end.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out_dir:
        config = DPOConfig(
            output_dir=out_dir,
            per_device_train_batch_size=args.batch_size,
            gradient_accumulation_steps=1,
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            adam_beta1=0.9,
            adam_beta2=0.999,
            max_grad_norm=1.0,
            beta=BETA,
            loss_type=["sigmoid"],
            max_length=None,
            bf16=False,  # TRL's DPOConfig defaults to bf16 autocast; this compares float32
            precompute_ref_log_probs=args.config != "trl-ref",
            gradient_checkpointing=args.config == "trl+gc",
            train_sampling_strategy="sequential",
            max_steps=args.steps,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            seed=0,
            dataloader_num_workers=0,
        )
        trainer = TokenIdsDPOTrainer(
            model=model,
            args=config,
            train_dataset=Dataset.from_list(pairs),
            processing_class=tokenizer,
            callbacks=[Clock()],
        )
        trainer.train()
    return {
        "version": trl.__version__,
        "step_end": step_end,
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "grad_norms": [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h],
        "gradient_checkpointing": bool(config.gradient_checkpointing),
        "bf16_autocast": bool(config.bf16),
        "reference": "per step" if args.config == "trl-ref" else "precomputed",
        "threads": torch.get_num_threads(),
    }


# --- the agentrl child ----------------------------------------------------------------------


def child_agentrl(args: argparse.Namespace, pairs: list[dict]) -> dict[str, Any]:
    import torch

    from agentrl.config import load_config
    from agentrl.devices import resolve_device
    from agentrl.models import load_model
    from agentrl.preference.data import Completion, PreferencePair
    from agentrl.preference.trainer import PreferenceTrainer
    from agentrl.run.settings import preference_settings

    cfg = load_config(
        None,
        [
            f"model.name={args.model_dir}",
            "preference.loss=dpo",
            f"preference.beta={BETA}",
            f"preference.batch_size={args.batch_size}",
            f"learner.lr={args.lr}",
            "learner.grad_clip=1.0",
        ],
    )
    device = resolve_device("cpu", "learner.device")
    model, tok = load_model(cfg.model.name, dtype="float32", device=device, seed=cfg.model.seed)
    trainer = PreferenceTrainer(model, preference_settings(cfg), device, tok.pad_token_id or 0)

    def completion(prompt: list[int], answer: list[int]) -> Completion:
        return Completion(prompt + answer, [0] * len(prompt) + [1] * len(answer))

    examples = [
        PreferencePair(
            completion(p["prompt_ids"], p["chosen_ids"]),
            completion(p["prompt_ids"], p["rejected_ids"]),
            f"pair {i}",
        )
        for i, p in enumerate(pairs)
    ]
    bs = args.batch_size
    ref = trainer.reference_logps(examples, bs)
    step_end, losses, grad_norms = [], [], []
    for i in range(0, len(examples), bs):
        values = trainer.step(examples[i : i + bs], ref[i : i + bs])
        step_end.append(time.perf_counter())
        losses.append(values["loss"])
        grad_norms.append(values["grad_norm"])
    return {
        "step_end": step_end,
        "losses": losses,
        "grad_norms": grad_norms,
        "gradient_checkpointing": False,
        "bf16_autocast": False,
        "reference": "precomputed",
        "fused_logprobs": cfg.learner.fused_logprobs,
        "threads": torch.get_num_threads(),
    }


def child_main(args: argparse.Namespace) -> None:
    pairs = load_pairs(args)
    t_start = time.time()
    out = child_agentrl(args, pairs) if args.config == "agentrl" else child_trl(args, pairs)
    last = out["step_end"][-1] if out["step_end"] else time.perf_counter()
    out["t_last_step_wall"] = time.time() - (time.perf_counter() - last)
    out["t_start_wall"] = t_start
    Path(args.out).write_text(json.dumps(out))


# --- the parent -----------------------------------------------------------------------------


def run_one(config: str, args: argparse.Namespace, model_dir: Path) -> dict:
    from benchmarks.vs_trl import TreeMemory

    python = sys.executable if config == "agentrl" else args.trl_python
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [
            str(python),
            str(Path(__file__).resolve()),
            "--child",
            config,
            "--steps",
            str(args.steps),
            "--batch-size",
            str(args.batch_size),
            "--lr",
            str(args.lr),
            "--pairs",
            str(args.pairs),
            *(["--synthetic", *map(str, args.synthetic)] if args.synthetic else []),
            "--model-dir",
            str(model_dir),
            "--out",
            str(out),
        ]
        load0 = os.getloadavg()
        t0 = time.time()
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        if config == "agentrl":
            env["PYTHONPATH"] = str(ROOT)
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        mem = TreeMemory(proc.pid)
        mem.start()
        log, _ = proc.communicate()
        mem.stop()
        wall = time.time() - t0
        if proc.returncode != 0:
            sys.stdout.write(log.decode(errors="replace")[-6000:])
            raise SystemExit(f"{config} failed (exit {proc.returncode})")
        res = json.loads(out.read_text())
    ends = res["step_end"]
    span = ends[-1] - ends[0]
    measured = len(ends) - 1
    rss, pss, _ = mem.peaks(res["t_last_step_wall"])
    return {
        "config": config,
        "s_per_step": span / measured,
        "step_s": [b - a for a, b in itertools.pairwise(ends)],
        "pairs_per_s": args.batch_size * measured / span,
        "peak_rss_mb": rss / 2**20,
        "peak_pss_mb": pss / 2**20,
        "losses": res["losses"],
        "grad_norms": res.get("grad_norms", []),
        "process_wall_s": wall,
        "loadavg_before": load0,
        "loadavg_after": os.getloadavg(),
        **{
            k: res[k]
            for k in ("version", "reference", "gradient_checkpointing", "fused_logprobs", "threads")
            if k in res
        },
    }


def summarize(args: argparse.Namespace, runs: list[dict], pairs: list[dict]) -> dict:
    configs = [c for c in args.configs if any(r["config"] == c for r in runs)]
    rounds = sorted({r["round"] for r in runs})
    by = {(r["round"], r["config"]): r for r in runs}
    rows = []
    for c in configs:
        mine = [by[(k, c)] for k in rounds if (k, c) in by]
        ratios = [
            by[(k, c)]["pairs_per_s"] / by[(k, "agentrl")]["pairs_per_s"]
            for k in rounds
            if (k, c) in by and (k, "agentrl") in by
        ]
        mem_ratios = [
            by[(k, c)]["peak_rss_mb"] / by[(k, "agentrl")]["peak_rss_mb"]
            for k in rounds
            if (k, c) in by and (k, "agentrl") in by
        ]
        rows.append(
            {
                "config": c,
                "pairs_per_s_median": statistics.median(r["pairs_per_s"] for r in mine),
                "pairs_per_s_rounds": [r["pairs_per_s"] for r in mine],
                "speed_vs_agentrl_rounds": ratios,
                "speed_vs_agentrl_median": statistics.median(ratios) if ratios else None,
                "peak_rss_mb_max": max(r["peak_rss_mb"] for r in mine),
                "peak_pss_mb_max": max(r["peak_pss_mb"] for r in mine),
                "rss_vs_agentrl_median": statistics.median(mem_ratios) if mem_ratios else None,
                "losses_round0": mine[0]["losses"],
            }
        )
    lengths = [len(p["prompt_ids"]) + len(p["chosen_ids"]) + len(p["rejected_ids"]) for p in pairs]
    result = {
        "benchmark": "dpo_vs_trl",
        "workload": {
            "model": "SmolLM2-135M-Instruct (float32)",
            "pairs": "synthetic" if args.synthetic else str(Path(args.pairs).relative_to(ROOT)),
            "synthetic_prompt_answer_len": args.synthetic,
            "batch_size_pairs": args.batch_size,
            "steps": args.steps,
            "timed_steps": args.steps - 1,
            "rounds": len(rounds),
            "lr": args.lr,
            "beta": BETA,
            "loss": "DPO sigmoid",
            "prompt_tokens_mean": statistics.mean(len(p["prompt_ids"]) for p in pairs),
            "answer_tokens_mean": statistics.mean(
                (len(p["chosen_ids"]) + len(p["rejected_ids"])) / 2 for p in pairs
            ),
            "pair_tokens_mean": statistics.mean(lengths),
        },
        "summary": rows,
        "runs": runs,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, shared with other jobs "
        "(nice 10): absolute timings are inflated, the per-round ratio is the figure",
    }
    print(
        f"{'config':9s} {'pairs/s':>9s} {'vs agentrl':>11s} {'peak RSS MB':>12s} "
        f"{'RSS vs agentrl':>15s}  losses (round 0)"
    )
    for r in rows:
        ratio = r["speed_vs_agentrl_median"]
        mem = r["rss_vs_agentrl_median"]
        print(
            f"{r['config']:9s} {r['pairs_per_s_median']:9.3f} "
            f"{(f'{ratio:.2f}x' if ratio else '-'):>11s} {r['peak_rss_mb_max']:12.0f} "
            f"{(f'{mem:.2f}x' if mem else '-'):>15s}  "
            + " ".join(f"{x:.4f}" for x in r["losses_round0"])
        )
    return result


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=4, help="steps per run; 2..N are timed")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=2, help="pairs per step")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--configs", nargs="+", default=["agentrl", "trl", "trl-ref"], choices=CONFIGS)
    ap.add_argument("--pairs", default=str(PAIRS), help="JSONL of chosen_ids/rejected_ids")
    ap.add_argument("--synthetic", nargs=2, type=int, metavar=("PROMPT_LEN", "ANSWER_LEN"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "dpo_vs_trl.json"))
    ap.add_argument("--child", choices=CONFIGS, help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.config = args.child
        child_main(args)
        return
    if args.steps < 2:
        ap.error("--steps must be >= 2 (the first step is not timed)")
    if "agentrl" not in args.configs:
        ap.error("--configs must include agentrl (the ratios are to it)")
    sys.path.insert(0, str(ROOT))
    from agentrl.models import _smollm2_dir
    from benchmarks.vs_trl import setup_trl

    pairs = load_pairs(args)  # a bad file fails here, before any process starts
    model_dir = _smollm2_dir()
    args.trl_python = setup_trl() if any(c != "agentrl" for c in args.configs) else None
    runs: list[dict] = []
    for rnd in range(args.rounds):
        shift = rnd % len(args.configs)
        for config in args.configs[shift:] + args.configs[:shift]:
            r = run_one(config, args, model_dir)
            r["round"] = rnd
            runs.append(r)
            Path(args.out + ".tmp").write_text(
                json.dumps({"benchmark": "dpo_vs_trl", "partial": True, "runs": runs}, indent=1)
            )
            print(
                f"round {rnd} {config:8s}: {r['pairs_per_s']:.3f} pairs/s, {r['s_per_step']:.1f} "
                f"s/step, peak RSS {r['peak_rss_mb']:.0f} MB, load {r['loadavg_before'][0]:.1f}, "
                f"losses {' '.join(f'{x:.4f}' for x in r['losses'])}",
                flush=True,
            )
    result = summarize(args, runs, pairs)
    Path(args.out).write_text(json.dumps(result, indent=1))
    Path(args.out + ".tmp").unlink(missing_ok=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
