"""What a model's weights must look like, checked before a sampler copies anything in.

    spec = WeightSpec.from_model(model)          # the hf sampler: its own module
    spec = WeightSpec.from_folder(model_dir)     # vllm / openai: safetensors headers + config
    state = spec.validate(weights, current_version)

A bad update (missing or unexpected keys, wrong shapes, an unreadable path) raises
:class:`~agentrl.errors.WeightUpdateError` naming the keys, before any weight is touched,
so the sampler keeps its previous weights and version. Tied tensors (input embeddings =
LM head) may be sent under either name; ``module.`` / ``_orig_mod.`` prefixes (DDP,
torch.compile) are stripped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentrl.errors import WeightUpdateError
from agentrl.types import WeightsLike
from agentrl.weights.files import load_weights, read_shapes, write_safetensors_dir

_STRIP_PREFIXES = ("module.", "_orig_mod.")
_TIED_HEAD = "lm_head.weight"
# names of input embeddings in Hugging Face checkpoints (Llama/Qwen, GPT-2, Bloom, NeoX)
_EMBEDDING_SUFFIXES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight")


@dataclass(frozen=True)
class WeightSpec:
    """The names and shapes a full update holds, and which names stand for the same tensor.

    ``shapes``: every name the target stores. ``ties``: name -> other names of the same
    tensor; a tied name that is not in ``shapes`` (an LM head a checkpoint folder leaves
    out) is accepted and dropped.
    """

    shapes: dict[str, tuple[int, ...]]
    ties: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def from_model(cls, model: torch.nn.Module) -> WeightSpec:
        state = model.state_dict()
        return cls({name: tuple(t.shape) for name, t in state.items()}, _tied_groups(state))

    @classmethod
    def from_folder(cls, folder: str | os.PathLike[str]) -> WeightSpec:
        """From a model folder's safetensors headers and config.json (no tensor data read)."""
        folder = Path(folder)
        shapes = read_shapes(folder)
        config = json.loads((folder / "config.json").read_text())
        ties: dict[str, tuple[str, ...]] = {}
        if config.get("tie_word_embeddings", False) and _TIED_HEAD not in shapes:
            embedding = next((n for n in shapes if n.endswith(_EMBEDDING_SUFFIXES)), None)
            ties[_TIED_HEAD] = (embedding,) if embedding else ()
            if embedding:
                ties[embedding] = (_TIED_HEAD,)
        return cls(shapes, ties)

    def check(
        self,
        shapes: Mapping[str, tuple[int, ...]],
        current_version: int,
        source: str | os.PathLike[str] | None = None,
    ) -> None:
        """Raise :class:`WeightUpdateError` unless `shapes` (name -> shape) is a full update;
        `source` (a path) is named in the message."""
        what = "new weights" if source is None else f"new weights from {source}"
        given = {_strip(name): tuple(shape) for name, shape in shapes.items()}
        extra = sorted(set(given) - set(self.shapes) - set(self.ties))
        missing = [
            name
            for name in self.shapes
            if name not in given and not any(alias in given for alias in self.ties.get(name, ()))
        ]
        if missing or extra:
            parts = [f"missing keys {_preview(missing)}"] if missing else []
            parts += [f"unexpected keys {_preview(extra)}"] if extra else []
            raise WeightUpdateError(
                f"{what} do not match the sampler's model: {'; '.join(parts)}. Publish the "
                "full state_dict (model.state_dict()) of the same architecture "
                f"(kept version {current_version})"
            )
        wrong = [
            f"{name}: {shape} != {expected}"
            for name, shape in given.items()
            if (expected := self._expected_shape(name)) is not None and shape != expected
        ]
        if wrong:
            raise WeightUpdateError(
                f"{what} have wrong shapes ({_preview(wrong)}); kept version {current_version}"
            )

    def validate(self, weights: WeightsLike, current_version: int) -> dict[str, torch.Tensor]:
        """Load `weights` (state dict, .safetensors file or folder), check it, and return
        it under the names in :attr:`shapes` (a tied name sent in place of another filled in)."""
        state = {_strip(name): t for name, t in load_weights(weights).items()}
        source = None if isinstance(weights, Mapping) else weights
        self.check({name: tuple(t.shape) for name, t in state.items()}, current_version, source)
        out = {}
        for name in self.shapes:
            sent = name if name in state else next(a for a in self.ties[name] if a in state)
            out[name] = state[sent]
        return out

    def stage(
        self,
        weights: WeightsLike,
        folder: str | os.PathLike[str],
        current_version: int,
        config_from: str | os.PathLike[str] | None = None,
    ) -> Path:
        """A checked safetensors folder an engine can reload from: a given folder as it is,
        or a state dict or single file written to `folder` (with `config_from`'s config.json)."""
        if isinstance(weights, str | os.PathLike):
            path = Path(weights)
            if path.is_dir():
                self.check(read_shapes(path), current_version, path)
                return path
            if not (path.is_file() and path.suffix == ".safetensors"):
                raise WeightUpdateError(
                    f"weights path {path} is neither a folder of safetensors files nor a "
                    ".safetensors file; pass a state dict, a file or a checkpoint folder"
                )
            # one file (a training checkpoint's policy): staged with the model's config
        state = self.validate(weights, current_version)
        return write_safetensors_dir(state, folder, config_from=config_from)

    def _expected_shape(self, name: str) -> tuple[int, ...] | None:
        if name in self.shapes:
            return self.shapes[name]
        return next((self.shapes[a] for a in self.ties.get(name, ()) if a in self.shapes), None)


def _tied_groups(state: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """name -> other names backed by the same storage (tied embeddings)."""
    by_storage: dict[tuple[int, int], list[str]] = {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        by_storage.setdefault(key, []).append(name)
    return {
        n: tuple(m for m in names if m != n)
        for names in by_storage.values()
        if len(names) > 1
        for n in names
    }


def _strip(name: str) -> str:
    for prefix in _STRIP_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name


def _preview(names: list[str], n: int = 5) -> str:
    shown = ", ".join(names[:n])
    return f"[{shown}{', ...' if len(names) > n else ''}] ({len(names)})"
