"""What the Tinker server's engines share: the records of a training client (its LoRA spec
and tensors), the ``tinker://`` checkpoint paths, the request errors with their HTTP status,
and the checks every placement makes before it queues a request."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentrl.errors import AgentRLError
from agentrl.run.tinker.decode import Request

OPTIMIZER_STATE = "optimizer.pt"
LORA_ALPHA = 32  # Tinker's scale convention: alpha 32, so rank 32 adds B @ A unscaled
SAMPLER_SLOTS = 8  # resident sampler snapshots (each one adapter's size)
EPHEMERAL = "ephemeral"  # the name prefix of unnamed sampler snapshots
PEFT_FOLDER = "peft"  # in a sampler snapshot's folder: its adapter as vLLM loads it (.vllm_lora)
EPHEMERAL_KEEP = 8  # unnamed snapshots kept per model (an async loop samples a few old ones)
_PATH = re.compile(r"^tinker://([^/]+)/(weights|sampler_weights)/([^/]+)$")


class RequestError(AgentRLError):
    """A request that names something the server does not have or cannot do (HTTP 400/404)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status

    def __reduce__(self) -> tuple[Any, ...]:  # the status survives a trip through Ray
        return (type(self), (str(self), self.status))


@dataclass
class LoraSpec:
    rank: int
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True
    seed: int | None = None
    alpha: float = LORA_ALPHA
    targets: tuple[str, ...] | None = None  # layer names; None: the three switches decide

    def as_json(self, base_model: str) -> dict[str, Any]:
        return {
            "base_model": base_model,
            "rank": self.rank,
            "alpha": self.alpha,
            "targets": list(self.targets) if self.targets else None,
            "train_attn": self.train_attn,
            "train_mlp": self.train_mlp,
            "train_unembed": self.train_unembed,
        }

    @classmethod
    def from_json(cls, meta: dict[str, Any]) -> LoraSpec:
        targets = meta.get("targets")
        return cls(
            meta["rank"],
            meta["train_attn"],
            meta["train_mlp"],
            meta["train_unembed"],
            alpha=meta.get("alpha", LORA_ALPHA),
            targets=tuple(targets) if targets else None,
        )


@dataclass
class TrainingModel:
    model_id: str
    adapter: str
    spec: LoraSpec
    params: dict[str, torch.nn.Parameter]  # canonical name -> this adapter's tensor
    optimizer: torch.optim.AdamW
    steps: int = 0
    ephemeral: list[str] = field(default_factory=list)  # unnamed sampler snapshots, oldest first


def canonical(name: str, adapter: str) -> str:
    return name.replace(f".{adapter}.", ".")


def unknown_model(model_id: str) -> RequestError:
    """The 404 of a model id no client created."""
    return RequestError(
        f"unknown model_id {model_id!r}: create it with create_lora_training_client "
        "(models live as long as the server)",
        404,
    )


def checkpoint_folder(state_dir: Path, path: str) -> tuple[Path, str]:
    """(folder, kind) of a ``tinker://MODEL_ID/KIND/NAME`` path under `state_dir`."""
    m = _PATH.match(path)
    if m is None:
        raise RequestError(
            f"path {path!r} is not a checkpoint of this server: expected "
            "tinker://MODEL_ID/weights/NAME or tinker://MODEL_ID/sampler_weights/NAME"
        )
    return Path(state_dir) / m.group(1) / m.group(2) / m.group(3), m.group(2)


def check_sample(request: Request, base_model: str, context_length: int) -> None:
    """Refuse a request that cannot be served (before it is queued)."""
    if not request.prompt:
        raise RequestError("prompt is empty")
    if len(request.prompt) + request.params.max_tokens > context_length:
        raise RequestError(
            f"prompt ({len(request.prompt)} tokens) + max_tokens "
            f"({request.params.max_tokens}) exceeds {base_model}'s context of "
            f"{context_length}"
        )


def linear_layers(model: Any) -> dict[str, str]:
    """Each linear layer's name (its last part) -> attn, mlp or unembed (Tinker's switches)."""
    layers: dict[str, str] = {}
    head = model.get_output_embeddings()
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        leaf = name.rsplit(".", 1)[-1]
        if module is head:
            layers[leaf] = "unembed"
        elif "attn" in name or "attention" in name:
            layers[leaf] = "attn"
        elif "mlp" in name or "ffn" in name or "feed_forward" in name:
            layers[leaf] = "mlp"
    return layers
