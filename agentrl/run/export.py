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

from pathlib import Path
from typing import Any

from agentrl.chat import ChatRenderer
from agentrl.config import load_config
from agentrl.envs import make_env
from agentrl.errors import CheckpointError
from agentrl.model_folder import write_model_folder
from agentrl.models import load_model as load_base
from agentrl.models import resolve_dtype
from agentrl.runfolder import CHECKPOINTS, CONFIG, policy_weights_file, resolve_checkpoint


def find_checkpoint(run_dir: str | Path, step: int | None = None) -> Path:
    """The run's latest checkpoint, or the one of `step` (an error lists the ones kept)."""
    run_dir = Path(run_dir)
    if not (run_dir / CONFIG).is_file():
        raise CheckpointError(
            f"{run_dir} is not a run directory (no {CONFIG}): pass the --run-dir of `agentrl train`"
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
    cfg = load_config(Path(run_dir) / CONFIG)
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
