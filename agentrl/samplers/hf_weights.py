"""Check new weights against the hf sampler's model before anything is copied.

A bad update (missing or unexpected keys, wrong shapes, an unreadable path) raises
:class:`~agentrl.errors.WeightUpdateError` naming the keys, and the sampler keeps its
previous weights and version. Tied parameters (input embeddings = LM head) may be sent
under either name; ``module.`` / ``_orig_mod.`` prefixes (DDP, torch.compile) are stripped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl.errors import WeightUpdateError
from agentrl.samplers.base import WeightsLike

_STRIP_PREFIXES = ("module.", "_orig_mod.")


@dataclass(frozen=True)
class WeightSpec:
    """Names and shapes a model's state dict must have; tied names may stand in for each other."""

    shapes: dict[str, tuple[int, ...]]
    ties: dict[str, tuple[str, ...]]

    @classmethod
    def from_model(cls, model: Any) -> WeightSpec:
        state = model.state_dict()
        return cls({name: tuple(t.shape) for name, t in state.items()}, _tied_groups(state))

    def validate(self, weights: WeightsLike, current_version: int) -> dict[str, torch.Tensor]:
        """Load `weights` (state dict, .safetensors file or folder) and check it fits."""
        state = {_strip(name): tensor for name, tensor in load_weights(weights).items()}
        extra = sorted(set(state) - set(self.shapes))
        missing = sorted(
            name
            for name in self.shapes
            if name not in state and not any(alias in state for alias in self.ties.get(name, ()))
        )
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing keys {_preview(missing)}")
            if extra:
                parts.append(f"unexpected keys {_preview(extra)}")
            raise WeightUpdateError(
                "new weights do not match the sampler's model: "
                + "; ".join(parts)
                + ". Publish the full state_dict of the same architecture "
                + f"(kept version {current_version})"
            )
        wrong = [
            f"{name}: {tuple(t.shape)} != {self.shapes[name]}"
            for name, t in state.items()
            if tuple(t.shape) != self.shapes[name]
        ]
        if wrong:
            raise WeightUpdateError(
                f"new weights have wrong shapes ({_preview(wrong)}); kept version {current_version}"
            )
        return state


def _tied_groups(state: Mapping[str, torch.Tensor]) -> dict[str, tuple[str, ...]]:
    """name -> other names backed by the same storage (tied embeddings)."""
    by_storage: dict[tuple[int, int], list[str]] = {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        by_storage.setdefault(key, []).append(name)
    return {n: tuple(m for m in names if m != n) for names in by_storage.values() for n in names}


def _strip(name: str) -> str:
    for prefix in _STRIP_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name


def _preview(names: list[str], n: int = 5) -> str:
    shown = ", ".join(names[:n])
    return f"[{shown}{', ...' if len(names) > n else ''}] ({len(names)})"


def load_weights(weights: WeightsLike) -> dict[str, torch.Tensor]:
    if isinstance(weights, Mapping):
        out = {}
        for name, t in weights.items():
            if not isinstance(t, torch.Tensor):
                raise WeightUpdateError(
                    f"weight {name!r} is a {type(t).__name__}, expected a torch.Tensor"
                )
            out[str(name)] = t
        return out
    from safetensors.torch import load_file

    path = Path(weights)
    if path.is_file() and path.suffix == ".safetensors":
        return load_file(str(path))
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        raise WeightUpdateError(
            f"weights path {str(path)!r} is neither a .safetensors file nor a folder with "
            "*.safetensors files; pass a state dict or such a path"
        )
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state
