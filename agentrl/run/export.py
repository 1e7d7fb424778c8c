"""Export a training checkpoint as a Hugging Face model folder.

    agentrl export runs/demo out/model            # the run's latest checkpoint
    agentrl export runs/demo --step 40 out/model  # a given step

The folder holds what ``AutoModelForCausalLM.from_pretrained`` and vLLM read: the weights
(safetensors), ``config.json``, the tokenizer, the chat template the run rendered with
(Hermes ChatML when the run's tools needed it, so the model sees at inference the format it
was trained on) and a ``generation_config.json`` that stops at the template's end-of-turn
token with the run's sampling settings. ``agentrl_export.json`` records where it came from.
Nothing is uploaded anywhere.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from agentrl.chat import ChatRenderer
from agentrl.config import load_config
from agentrl.envs import make_env
from agentrl.errors import CheckpointError
from agentrl.models import load_model as load_base
from agentrl.models import resolve_dtype
from agentrl.run.checkpoint_files import CHECKPOINTS, policy_weights_file, resolve_checkpoint

EXPORT_RECORD = "agentrl_export.json"


def find_checkpoint(run_dir: str | Path, step: int | None = None) -> Path:
    """The run's latest checkpoint, or the one of `step` (an error lists the ones kept)."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise CheckpointError(
            f"{run_dir} is not a run directory (no config.yaml): pass the --run-dir of "
            "`agentrl train`"
        )
    if step is None:
        return resolve_checkpoint(run_dir)
    folder = run_dir / CHECKPOINTS / f"step_{step:06d}"
    kept = sorted(p.name for p in (run_dir / CHECKPOINTS).glob("step_*") if p.is_dir())
    if not folder.is_dir():
        raise CheckpointError(
            f"{run_dir} has no checkpoint of step {step}; kept: "
            + (", ".join(kept) or "none")
            + " (raise orchestrator.checkpoint_every granularity to keep others)"
        )
    return resolve_checkpoint(folder)


def chat_template_of(cfg: Any, tokenizer: Any) -> tuple[str, Any]:
    """(template source, renderer) the run rendered its conversations with: the run's
    environment's tools decide, as in :func:`agentrl.run.components.build_engine`."""
    env = make_env(cfg.env.name, **cfg.env.options)  # tools only; its tasks are not read
    renderer = ChatRenderer(tokenizer, tools=env.tool_schemas(), template=cfg.model.chat_template)
    return renderer.chat_template, renderer


def export_checkpoint(
    run_dir: str | Path,
    out: str | Path,
    *,
    step: int | None = None,
    dtype: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the policy of a run's checkpoint to `out` as a Hugging Face folder."""
    from safetensors.torch import load_model

    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise CheckpointError(f"{out} exists and is not empty: choose a new folder or --overwrite")
    ckpt = find_checkpoint(run_dir, step)
    weights, version = policy_weights_file(ckpt)
    cfg = load_config(Path(run_dir) / "config.yaml")
    model, tokenizer = load_base(cfg.model.name, dtype="float32", seed=cfg.model.seed)
    missing, unexpected = load_model(model, str(weights), strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    if unexpected or set(missing) - tied - {"lm_head.weight"}:
        raise CheckpointError(
            f"{weights} does not fit {cfg.model.name!r} (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}): was the run's model.name changed?"
        )
    if dtype is not None:
        model = model.to(resolve_dtype(dtype))
    _, renderer = chat_template_of(cfg, tokenizer)
    record = {
        "run_dir": str(Path(run_dir).resolve()),
        "checkpoint": ckpt.name,
        "version": version,
        "base_model": cfg.model.name,
    }
    return write_model_folder(model, renderer, out, sampler=cfg.sampler, record=record)


def write_model_folder(
    model: Any,
    renderer: Any,
    out: str | Path,
    *,
    sampler: Any = None,
    record: dict[str, Any] | None = None,
) -> Path:
    """Save `model` with its renderer's tokenizer and chat template and a generation config
    that stops where the renderer's turns end (sampling settings from `sampler`, a
    :class:`~agentrl.config.SamplerConfig`, else greedy); written whole or not at all."""
    import torch
    from transformers import GenerationConfig

    out = Path(out)
    tokenizer = renderer.tokenizer
    tokenizer.chat_template = renderer.chat_template
    stop = list(renderer.stop_token_ids)
    sampling: dict[str, Any] = {"do_sample": False}
    if sampler is not None and sampler.temperature > 0:
        sampling = {
            "do_sample": True,
            "temperature": sampler.temperature,
            "top_p": sampler.top_p,
            "top_k": sampler.top_k,
        }
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop[0]
    model.generation_config = GenerationConfig(
        bos_token_id=getattr(model.config, "bos_token_id", None),
        eos_token_id=stop[0] if len(stop) == 1 else stop,
        pad_token_id=pad,
        max_new_tokens=sampler.max_new_tokens if sampler is not None else 256,
        **sampling,
    )
    record = {
        **(record or {}),
        "chat_template": renderer.template_name,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        with torch.no_grad():
            model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / EXPORT_RECORD).write_text(json.dumps(record, indent=1))
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
