"""A self-contained model folder (``save_pretrained`` weights, the tokenizer with the
renderer's chat template, a generation config that stops where the renderer's turns end,
and ``agentrl_export.json``): what ``agentrl export``, ``agentrl sft`` and ``agentrl dpo``
write, loadable by transformers, vLLM or ``model.name`` without agentrl.

Core-level: the training modes below the run layer and the run layer's export both write it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

EXPORT_RECORD = "agentrl_export.json"  # where the folder came from (base model, step, ...)


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
        publish_folder(model, tokenizer, tmp, out, EXPORT_RECORD, record)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def publish_folder(
    model: Any, tokenizer: Any, folder: Path, out: Path, record_name: str, record: dict[str, Any]
) -> None:
    """Write `model` (safetensors), `tokenizer` and the JSON `record` into the staging
    `folder`, then move it to `out` in one rename (an old `out` is replaced)."""
    import torch

    with torch.no_grad():
        model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    (folder / record_name).write_text(json.dumps(record, indent=1))
    if out.exists():
        shutil.rmtree(out)
    os.rename(folder, out)
