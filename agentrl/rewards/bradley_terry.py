"""Train a Bradley–Terry reward model on preference pairs (``agentrl rm train``).

    agentrl rm train prefs.jsonl --model smollm2-135m-instruct --out runs/rm

Each JSONL row is a pair: ``{"prompt": "...", "chosen": "...", "rejected": "..."}``, or
TRL's conversational form (``chosen`` / ``rejected`` as message lists, with or without a
separate ``prompt`` list). The model is the base model with an
``AutoModelForSequenceClassification`` head (one output), scored on the last token of the
conversation rendered with the model's chat template, and trained on

    loss = -log σ(r(x, y_chosen) - r(x, y_rejected))          (Bradley & Terry, 1952)

A held-out share of the pairs measures pairwise accuracy (how often r_chosen > r_rejected)
before and after training; the folder written is a normal Hugging Face model folder that
``reward.model`` (and ``AutoModelForSequenceClassification``) loads.

It trains on the trainer core (:mod:`agentrl.learner.core`) and reads the sections every
trainer reads: ``model.name`` (the base model when none is given), ``learner.*`` (lr,
betas, weight decay, clipping, schedule, micro-batch size, device, precision), resolved by
the run layer (:func:`agentrl.run.settings.reward_model_training_settings`) with the CLI
flags as overrides; ``lr`` is 5e-5 unless the config or a flag sets ``learner.lr``.
"""

from __future__ import annotations

import math
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentrl.chat import load_template
from agentrl.envs.dataset import read_jsonl
from agentrl.errors import DatasetError, ModelLoadError
from agentrl.model_folder import publish_folder
from agentrl.models import load_model, resolve_model_dir
from agentrl.rewards.reward_model import encode_batch, ensure_pad_token, render_for_reward
from agentrl.rewards.settings import RewardModelTrainingSettings

Message = dict[str, Any]
RECORD = "reward_model.json"


@dataclass
class PreferencePair:
    chosen: list[Message]
    rejected: list[Message]
    where: str


def _chat(value: Any, prompt: list[Message], key: str, where: str) -> list[Message]:
    if isinstance(value, str):
        if not value.strip():
            raise DatasetError(f"{where}: field {key!r} is empty")
        return [*prompt, {"role": "assistant", "content": value}]
    if (
        isinstance(value, list)
        and value
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)
    ):
        return [*prompt, *value]
    raise DatasetError(
        f"{where}: field {key!r} must be a string or a list of {{role, content}} messages "
        f"(got {str(value)[:60]!r})"
    )


def read_pairs(path: str | Path) -> list[PreferencePair]:
    """Preference pairs of a JSONL file; a bad row is an error naming its line."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such preference file")
    pairs = []
    for where, row in read_jsonl(path):
        if not isinstance(row, dict):
            raise DatasetError(f"{where}: expected an object with chosen and rejected")
        for key in ("chosen", "rejected"):
            if row.get(key) is None:
                raise DatasetError(
                    f"{where}: missing field {key!r}; a row is "
                    '{"prompt": ..., "chosen": ..., "rejected": ...}'
                )
        prompt = row.get("prompt")
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        elif prompt is None:
            prompt = []
        elif not isinstance(prompt, list):
            raise DatasetError(f"{where}: field 'prompt' must be a string or a message list")
        chosen = _chat(row["chosen"], prompt, "chosen", where)
        rejected = _chat(row["rejected"], prompt, "rejected", where)
        if chosen == rejected:
            raise DatasetError(
                f"{where}: 'chosen' and 'rejected' are identical; a preference pair needs two "
                "different answers (drop the row)"
            )
        pairs.append(PreferencePair(chosen, rejected, where))
    if len(pairs) < 2:
        raise DatasetError(f"{path}: {len(pairs)} preference pairs; need at least 2")
    return pairs


def base_model_folder(name: str, workdir: Path) -> str:
    """A folder (or hub id) ``from_pretrained`` reads for `name`: tiny-llama is written out
    once into `workdir`, aliases and .gguf files resolve as for the policy."""
    if name == "tiny-llama":
        model, tokenizer = load_model(name, dtype="float32")
        model.save_pretrained(workdir)
        tokenizer.save_pretrained(workdir)
        return str(workdir)
    try:
        return str(resolve_model_dir(name))
    except ModelLoadError:
        return name  # a hub id (needs network)


@dataclass
class RewardModelReport:
    out: str
    train_pairs: int
    eval_pairs: int
    accuracy_before: float
    accuracy: float  # held-out pairwise accuracy after training
    loss: float  # mean loss of the last epoch
    epochs: int
    seconds: float


def _scores(model: Any, tokenizer: Any, texts: Sequence[str], max_length: int, device: str) -> Any:
    enc = encode_batch(tokenizer, texts, max_length).to(device)
    return model(**enc).logits[:, 0]


def pairwise_accuracy(
    model: Any,
    tokenizer: Any,
    pairs: Sequence[PreferencePair],
    *,
    batch_size: int = 16,
    max_length: int = 1024,
    device: str = "cpu",
) -> float:
    """Share of pairs with r(chosen) > r(rejected)."""
    import torch

    if not pairs:
        return float("nan")
    wins = 0
    model.eval()
    with torch.inference_mode():
        for i in range(0, len(pairs), batch_size):
            chunk = pairs[i : i + batch_size]
            texts = [render_for_reward(tokenizer, p.chosen) for p in chunk]
            texts += [render_for_reward(tokenizer, p.rejected) for p in chunk]
            r = _scores(model, tokenizer, texts, max_length, device)
            wins += int((r[: len(chunk)] > r[len(chunk) :]).sum())
    return wins / len(pairs)


def train_reward_model(
    pairs_path: str | Path,
    out: str | Path,
    settings: RewardModelTrainingSettings | None = None,
    *,
    log: Callable[[str], None] = print,
) -> RewardModelReport:
    """Train and save a reward model; returns the report (also in ``OUT/reward_model.json``).
    `settings`: resolved by the run layer
    (:func:`agentrl.run.settings.reward_model_training_settings`, the CLI flags applied)."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from agentrl.learner.core import CoreSettings, TrainerCore
    from agentrl.learner.precision import Precision
    from agentrl.models import _quiet_transformers

    _quiet_transformers()
    s = settings or RewardModelTrainingSettings()
    model, epochs, batch_size, seed = s.model, s.epochs, s.batch_size, s.seed
    eval_fraction, max_length = s.eval_fraction, s.max_length
    if not 0 <= eval_fraction < 1:
        raise DatasetError(f"--eval-fraction must be in [0, 1) (got {eval_fraction})")
    t0 = time.time()
    pairs = read_pairs(pairs_path)
    random.Random(seed).shuffle(pairs)
    n_eval = max(1, round(len(pairs) * eval_fraction)) if eval_fraction > 0 else 0
    held_out, train = pairs[:n_eval], pairs[n_eval:]
    precision = Precision.from_settings(s.train)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        torch.manual_seed(seed)
        base = base_model_folder(model, tmp / "base")
        tokenizer = AutoTokenizer.from_pretrained(base)
        rm = AutoModelForSequenceClassification.from_pretrained(
            base, num_labels=1, dtype=torch.float32
        )
        ensure_pad_token(tokenizer, rm)
        if not getattr(tokenizer, "chat_template", None):  # scored as it is trained
            tokenizer.chat_template = load_template("hermes_chatml")[1]
        steps = epochs * math.ceil(len(train) / batch_size)
        core = TrainerCore(rm, CoreSettings.of(s.train, total_steps=steps), precision=precision)
        device = str(core.device)
        before = pairwise_accuracy(rm, tokenizer, held_out, max_length=max_length, device=device)
        rng = random.Random(seed + 1)
        epoch_loss = math.nan
        micro = max(1, s.train.micro_batch_size // 2)  # a pair is two sequences
        for epoch in range(epochs):
            rm.train()
            order = list(train)
            rng.shuffle(order)
            losses = []
            for i in range(0, len(order), batch_size):
                chunk = order[i : i + batch_size]

                def loss_of(part: list[PreferencePair], counts: bool, n: int = len(chunk)) -> Any:
                    texts = [render_for_reward(tokenizer, p.chosen) for p in part]
                    texts += [render_for_reward(tokenizer, p.rejected) for p in part]
                    with core.precision.autocast():
                        r = _scores(rm, tokenizer, texts, max_length, device).float()
                    # the batch's mean pairwise loss, micro-batch by micro-batch
                    return -F.logsigmoid(r[: len(part)] - r[len(part) :]).sum() / n

                parts = [(chunk[j : j + micro], True) for j in range(0, len(chunk), micro)]
                done = core.update(parts, loss_of)
                core.end_step()
                losses.append(float(done.loss))
            epoch_loss = sum(losses) / max(len(losses), 1)
            log(f"epoch {epoch + 1}/{epochs}: loss {epoch_loss:.4f}")
        after = pairwise_accuracy(rm, tokenizer, held_out, max_length=max_length, device=device)
        report = RewardModelReport(
            out=str(out),
            train_pairs=len(train),
            eval_pairs=len(held_out),
            accuracy_before=before,
            accuracy=after,
            loss=epoch_loss,
            epochs=epochs,
            seconds=time.time() - t0,
        )
        record = {**asdict(report), "base_model": model}
        publish_folder(rm, tokenizer, tmp / "model", out, RECORD, record)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report
