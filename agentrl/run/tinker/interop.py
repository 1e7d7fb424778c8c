"""LoRA both ways between the Tinker server and agentrl.

* A Tinker checkpoint folder (``STATE_DIR/MODEL_ID/weights/NAME`` or ``.../sampler_weights/
  NAME``) exports as a model folder: ``agentrl export FOLDER OUT`` merges the adapter into
  the base model and writes what ``model.name``, ``agentrl serve``, transformers and vLLM
  load (:func:`export_tinker_checkpoint`).
* An agentrl run (or one of its checkpoints) trained with ``model.lora`` is a Tinker starting
  state: ``service_client.create_training_client_from_state("/path/to/run")`` on a server
  holding the run's ``model.name`` loads its adapter (:func:`read_run_adapter`; the server
  reads a local path that is not ``tinker://`` this way).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from agentrl.errors import CheckpointError
from agentrl.runfolder import ADAPTER_WEIGHTS, CONFIG, LEARNER_PART, resolve_checkpoint

LORA_META = "lora.json"
PEFT_ADAPTER = "default"  # the adapter name agentrl's learner gives its one LoRA


def read_run_adapter(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(lora.json-style meta, tensors under the server's names) of an agentrl run's LoRA."""
    from safetensors.torch import load_file

    from agentrl.config import load_config

    ckpt = resolve_checkpoint(path)
    config = ckpt.parent.parent / CONFIG
    adapter = ckpt / LEARNER_PART / ADAPTER_WEIGHTS
    if not config.is_file() or not adapter.is_file():
        raise CheckpointError(
            f"{path} is not a LoRA checkpoint of an agentrl run (need {CONFIG} and "
            f"{LEARNER_PART}/{ADAPTER_WEIGHTS}; full fine-tunes have no adapter to load)"
        )
    cfg = load_config(config)
    lora = cfg.model.lora
    assert lora is not None  # an adapter file exists only for model.lora runs
    targets = lora.target_modules
    meta = {
        "base_model": cfg.model.name,
        "rank": lora.r,
        "alpha": lora.alpha,
        "targets": None if targets == "all-linear" else list(targets),
        "train_attn": True,
        "train_mlp": True,
        "train_unembed": False,  # peft's all-linear leaves the LM head out
        "source": str(ckpt),
    }
    tensors = {k.replace(f".{PEFT_ADAPTER}.", "."): t for k, t in load_file(str(adapter)).items()}
    return meta, tensors


def export_tinker_checkpoint(
    folder: str | Path, out: str | Path, *, dtype: str | None = None, overwrite: bool = False
) -> Path:
    """Merge a Tinker checkpoint's adapter into its base model and write a model folder."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file

    from agentrl.chat import ChatRenderer
    from agentrl.model_folder import write_model_folder
    from agentrl.models import load_model, resolve_dtype
    from agentrl.run.tinker.adapters import linear_layers

    folder, out = Path(folder), Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise CheckpointError(f"{out} exists and is not empty: choose a new folder or --overwrite")
    if not (folder / LORA_META).is_file() or not (folder / ADAPTER_WEIGHTS).is_file():
        raise CheckpointError(
            f"{folder} is not a Tinker checkpoint of agentrl serve --tinker (no {LORA_META} / "
            f"{ADAPTER_WEIGHTS}): pass STATE_DIR/MODEL_ID/weights/NAME or .../sampler_weights/NAME"
        )
    meta = json.loads((folder / LORA_META).read_text())
    model, tokenizer = load_model(meta["base_model"], dtype="float32")
    wanted = {
        "attn": meta["train_attn"],
        "mlp": meta["train_mlp"],
        "unembed": meta["train_unembed"],
    }
    targets = meta.get("targets") or sorted(
        leaf for leaf, kind in linear_layers(model).items() if wanted[kind]
    )
    head = model.get_output_embeddings()
    if getattr(model.config, "tie_word_embeddings", False) and any(
        linear_layers(model).get(t) == "unembed" for t in targets
    ):  # merging into a tied head would change the input embedding too: untie first
        head.weight = torch.nn.Parameter(head.weight.detach().clone())
        model.config.tie_word_embeddings = False
    cfg = LoraConfig(
        r=meta["rank"], lora_alpha=meta.get("alpha", 32), target_modules=targets, bias="none"
    )
    peft = get_peft_model(model, cfg)
    params = dict(peft.base_model.model.named_parameters())
    state = load_file(str(folder / ADAPTER_WEIGHTS))
    with torch.no_grad():
        for name, t in state.items():
            key = name.replace(".lora_A.", f".lora_A.{PEFT_ADAPTER}.").replace(
                ".lora_B.", f".lora_B.{PEFT_ADAPTER}."
            )
            if key not in params:
                raise CheckpointError(f"{folder}: {name} does not fit {meta['base_model']}")
            params[key].copy_(t)
    merged = peft.merge_and_unload()
    if dtype is not None:
        merged = merged.to(resolve_dtype(dtype))
    record = {"tinker_checkpoint": str(folder.resolve()), "base_model": meta["base_model"]}
    record |= {"lora_rank": meta["rank"], "steps": meta.get("steps")}
    return write_model_folder(merged, ChatRenderer(tokenizer), out, record=record)
