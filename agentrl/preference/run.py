"""`agentrl dpo DATA --run-dir RUN`: a preference run from a file, with checkpoints.

    RUN/config.yaml              the whole config (preference section included)
    RUN/preference_data.json     the data it read, for --resume
    RUN/reference_logps.pt       the reference log-probs, computed once (keyed by a digest
                                 of the encoded examples and the model)
    RUN/metrics.jsonl            one line per step, eval lines before and after
    RUN/checkpoints/step_N/      policy, optimizer and RNG states, epoch and position
    RUN/model/                   the trained model folder (or --out)

``agentrl export RUN OUT`` reads the checkpoints like a training run's. With
``learner.world_size`` > 1 every rank calls :func:`train_preference` in one process group
(``torchrun``, or any launcher that sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``): each trains its share of every batch, rank 0 writes the files.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentrl.errors import CheckpointError, ConfigError, DatasetError
from agentrl.learner import compiled
from agentrl.learner.settings import TrainSettings
from agentrl.model_folder import write_model_folder
from agentrl.models import load_model
from agentrl.preference.data import (
    encode_pairs,
    encode_unpaired,
    fingerprint,
    iter_completions,
    read_rows,
)
from agentrl.preference.settings import PreferenceSettings
from agentrl.preference.trainer import Example, PreferenceTrainer
from agentrl.runfolder import (
    CONFIG,
    METRICS,
    REPORT,
    MetricsFile,
    has_checkpoint,
    load_run_checkpoint,
    save_run_checkpoint,
)
from agentrl.training.sft import renderer_factory

DATA_RECORD = "preference_data.json"
REFERENCE_CACHE = "reference_logps.pt"


@dataclass
class PreferenceReport:
    run_dir: str
    model: str
    loss: str
    examples: int
    eval_examples: int
    skipped_long: int
    steps: int
    eval_before: dict[str, float] = field(default_factory=dict)
    eval_after: dict[str, float] = field(default_factory=dict)
    reference_cached: bool = False  # read from the run instead of computed
    seconds: float = 0.0
    examples_per_s: float = 0.0


def save_trainer(trainer: PreferenceTrainer, folder: Path, step: int) -> None:
    """The trainer's part of a checkpoint (the trainer core's layout, which ``agentrl
    export`` reads); a collective with several ranks."""
    trainer.core.save(folder, state={}, meta={"version": step, "step": step})


def load_trainer(trainer: PreferenceTrainer, folder: Path) -> None:
    trainer.core.load(folder)


def checkpoint_ranks(
    trainer: PreferenceTrainer, run_dir: Path, step: int, loop: dict[str, Any]
) -> None:
    """A run checkpoint: rank 0 writes the folder and tells the other ranks where the
    trainer's part goes (each writes its shards there)."""
    import torch.distributed as dist

    ranks = trainer.core.ranks
    if ranks.world_size == 1:
        save_run_checkpoint(run_dir, step, loop, lambda part: save_trainer(trainer, part, step))
        return

    def save_part(part: Path) -> None:
        dist.broadcast_object_list([str(part)], src=0)
        save_trainer(trainer, part, step)

    if ranks.is_main:
        save_run_checkpoint(run_dir, step, loop, save_part)
    else:
        where: list[Any] = [None]
        dist.broadcast_object_list(where, src=0)
        save_trainer(trainer, Path(where[0]), step)
    ranks.barrier()


def join_ranks(train: TrainSettings) -> bool:
    """``learner.world_size`` > 1: join the process group a launcher set up (``RANK``,
    ``WORLD_SIZE`` and ``MASTER_ADDR`` / ``MASTER_PORT`` in the environment). True when this
    call joined it (the caller leaves it when done)."""
    import os

    import torch.distributed as dist

    from agentrl.learner.distributed import init_rank_group

    if train.world_size == 1 or dist.is_initialized():
        return False
    if "RANK" not in os.environ:
        raise ConfigError(
            f"learner.world_size={train.world_size}: start one process per rank, e.g. "
            f"torchrun --nproc-per-node {train.world_size} -m agentrl.cli dpo ..."
        )
    address = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    init_rank_group(
        int(os.environ["RANK"]),
        int(os.environ["WORLD_SIZE"]),
        address,
        device=train.torch_device,
        timeout_s=train.collective_timeout_s,
    )
    return True


def reference_for(
    trainer: PreferenceTrainer, examples: list[Example], run_dir: Path, model: str, resume: bool
) -> tuple[torch.Tensor | None, bool]:
    """(reference log-probs [N, 2] or None, whether they came from the run's cache)."""
    if not trainer.needs_reference:
        return None, False
    key = fingerprint(examples, model)
    path = run_dir / REFERENCE_CACHE
    if path.is_file():
        cached = torch.load(path, map_location="cpu", weights_only=True)
        if cached.get("fingerprint") == key:
            return cached["logps"], True
        if resume:
            raise CheckpointError(
                f"{path} was computed for other examples or another model than this resume "
                "reads: resume with the data and config the run started with"
            )
    if resume:
        raise CheckpointError(
            f"--resume: {path} is missing; the reference cannot be recomputed from trained "
            "weights. Start the run again without --resume"
        )
    ref = trainer.reference_logps(examples, trainer.settings.batch_size)
    if trainer.core.ranks.is_main:
        torch.save({"fingerprint": key, "model": model, "logps": ref}, path)
    return ref, False


def train_preference(
    data: str | Path | None,
    run_dir: str | Path,
    *,
    settings: PreferenceSettings | None = None,
    resume: bool = False,
    out: str | Path | None = None,
    log: Callable[[str], None] = print,
    compile_backend: compiled.Backend = compiled.DEFAULT_BACKEND,
) -> PreferenceReport:
    """Train ``preference.loss`` on the rows of `data` (or ``data.path``); see the
    module docstring for what the run directory holds. `settings`: resolved by the run
    layer (:func:`agentrl.run.settings.preference_settings`; with `resume`, of the run's
    own ``config.yaml``)."""
    t0 = time.time()
    run_dir = Path(run_dir)
    record = run_dir / DATA_RECORD
    if resume and settings is None:
        raise ValueError("resume: pass the run's own settings (preference_settings_of_run)")
    pc = settings or PreferenceSettings()
    if resume:
        if not (run_dir / CONFIG).is_file():
            raise CheckpointError(f"--resume: {run_dir} has no {CONFIG} (not a dpo run)")
        if data is None and record.is_file():
            data = json.loads(record.read_text())["data"]
    joined = join_ranks(pc.train)
    import torch.distributed as dist

    main = not dist.is_initialized() or dist.get_rank() == 0
    if not resume and main:
        if has_checkpoint(run_dir):
            raise CheckpointError(
                f"{run_dir} already holds a run: continue it with --resume, or pick a new --run-dir"
            )
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / CONFIG).write_text(pc.config_yaml)
        record.write_text(json.dumps({"data": None if data is None else str(Path(data).resolve())}))
        (run_dir / METRICS).unlink(missing_ok=True)
    rows = read_rows(data, pc.data)
    device = pc.train.torch_device
    torch.manual_seed(pc.seed)
    model, tokenizer = load_model(pc.model.name, dtype="float32", device=device, seed=pc.model.seed)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    steps_per_epoch = math.ceil(max(len(rows) * (1 - pc.eval_fraction), 1) / pc.batch_size)
    trainer = PreferenceTrainer(
        model,
        pc,
        device,
        pad_id,
        total_steps=pc.epochs * steps_per_epoch,
        compile_backend=compile_backend,
    )
    renderer_for = renderer_factory(
        pc.tools, pc.chat_template, tokenizer, any(r.tools is None for r in rows)
    )
    encoded: list[Example] = (
        list(encode_unpaired(rows, renderer_for, pc.seed))
        if trainer.unpaired
        else list(encode_pairs(rows, renderer_for))
    )
    examples = [
        e for e in encoded if all(len(s.input_ids) <= pc.max_length for s in iter_completions([e]))
    ]
    skipped = len(encoded) - len(examples)
    if skipped:
        log(f"skipped {skipped} examples longer than preference.max_length {pc.max_length}")
    if not examples:
        raise DatasetError(f"every example is longer than preference.max_length {pc.max_length}")
    random.Random(pc.seed).shuffle(examples)
    n_eval = round(len(examples) * pc.eval_fraction) if pc.eval_fraction > 0 else 0
    if n_eval >= len(examples):
        n_eval = len(examples) - 1
    ref, cached = reference_for(trainer, examples, run_dir, pc.model.name, resume)
    held_out, train = examples[:n_eval], examples[n_eval:]
    ref_eval = ref[:n_eval] if ref is not None else None
    ref_train = ref[n_eval:] if ref is not None else None
    metrics = _RankMetrics(run_dir / METRICS if main else None)

    step, epoch, position = 0, 0, 0
    before: dict[str, float] = {}
    if resume:
        ckpt, state = load_run_checkpoint(run_dir, lambda part: load_trainer(trainer, part))
        step, epoch, position = state["step"], state["epoch"], state["position"]
        before = state.get("eval_before", {})
        log(f"resumed from {ckpt.name}: epoch {epoch + 1}, step {step}")
    else:
        before = trainer.evaluate(held_out, ref_eval, pc.batch_size)
        if before:
            metrics.write("eval", 0, before)
            log(f"held-out before: accuracy {before['accuracy']:.3f}, loss {before['loss']:.4f}")

    def checkpoint() -> None:
        loop = {"step": step, "epoch": epoch, "position": position, "eval_before": before}
        checkpoint_ranks(trainer, run_dir, step, loop)

    bs = pc.batch_size
    trained_examples, train_seconds, last_loss = 0, 0.0, math.nan
    while epoch < pc.epochs:
        order = list(range(len(train)))
        random.Random(pc.seed * 1000 + epoch).shuffle(order)
        while position < len(order):
            index = order[position : position + bs]
            batch = [train[i] for i in index]
            part = ref_train[index] if ref_train is not None else None
            s0 = time.perf_counter()
            values = trainer.step(batch, part)
            train_seconds += time.perf_counter() - s0
            trained_examples += len(batch)
            step, position = step + 1, position + len(index)
            last_loss = values["loss"]
            metrics.write("train", step, {"epoch": epoch, **values})
            if pc.checkpoint_every and step % pc.checkpoint_every == 0:
                checkpoint()
        epoch, position = epoch + 1, 0
        if pc.checkpoint_every and epoch < pc.epochs and step % pc.checkpoint_every:
            checkpoint()  # an epoch's end is a checkpoint too when checkpoints are asked for
        log(f"epoch {epoch}/{pc.epochs}: step {step}, last loss {last_loss:.4f}")
    if not (pc.checkpoint_every and step % pc.checkpoint_every == 0):
        checkpoint()  # the last step is always kept (agentrl export reads it)
    after = trainer.evaluate(held_out, ref_eval, pc.batch_size)
    if after:
        metrics.write("eval", step, after)
        log(f"held-out after: accuracy {after['accuracy']:.3f}, loss {after['loss']:.4f}")
    folder = Path(out) if out is not None else run_dir / "model"
    report = PreferenceReport(
        run_dir=str(run_dir),
        model=str(folder),
        loss=pc.loss,
        examples=len(train),
        eval_examples=len(held_out),
        skipped_long=skipped,
        steps=step,
        eval_before=before,
        eval_after=after,
        reference_cached=cached,
        seconds=time.time() - t0,
        examples_per_s=trained_examples / train_seconds if train_seconds else math.nan,
    )
    plain = trainer.plain_model(
        lambda: load_model(pc.model.name, dtype="float32", seed=pc.model.seed)[0]
    )
    if main:
        write_model_folder(
            plain,
            renderer_for(rows[0].tools),
            folder,
            record={"base_model": pc.model.name, "preference": asdict(report)},
        )
        (run_dir / REPORT).write_text(json.dumps(asdict(report), indent=1))
    if joined:
        from agentrl.learner.distributed import leave_rank_group

        leave_rank_group()  # every rank waits for rank 0's model folder first
    else:
        trainer.core.ranks.barrier()
    return report


class _RankMetrics:
    """``metrics.jsonl`` on rank 0; the other ranks' lines (the same numbers) go nowhere."""

    def __init__(self, path: Path | None) -> None:
        self.file = MetricsFile(path) if path is not None else None

    def write(self, kind: str, step: int, values: dict[str, Any]) -> None:
        if self.file is not None:
            self.file.log(kind, step, values)
