"""Weights on disk: the shared-memory root, and safetensors folders written and read.

Every folder of weights agentrl writes goes through :func:`write_safetensors_dir`: tensors
that share storage (tied embeddings) are written once, under their first name (safetensors
refuses shared storage; :class:`~agentrl.weights.spec.WeightSpec` resolves the other name
on the way back in), and the folder appears atomically (a temp sibling renamed into place),
so a reader never sees half a checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch

from agentrl.errors import WeightUpdateError
from agentrl.types import WeightsLike


def shm_root() -> Path:
    """``/dev/shm`` where it exists and is writable (RAM-backed), else the temp folder."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def write_safetensors_dir(
    state: Mapping[str, torch.Tensor],
    folder: str | os.PathLike[str],
    *,
    metadata: Mapping[str, str] | None = None,
    config_from: str | os.PathLike[str] | None = None,
) -> Path:
    """Write `state` as ``<folder>/model.safetensors`` (replacing `folder` atomically).

    `config_from`: a model folder whose ``config.json`` is copied along (engines that
    reload from the folder, such as vLLM, read it there).
    """
    from safetensors.torch import save_file

    target = Path(folder)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        save_file(
            unshared(state),
            str(tmp / "model.safetensors"),
            metadata=dict(metadata) if metadata else None,
        )
        if config_from is not None:
            shutil.copy(Path(config_from) / "config.json", tmp / "config.json")
        if target.exists():
            shutil.rmtree(target)
        os.rename(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def unshared(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` on the CPU, contiguous, each storage once (the first name of tied tensors)."""
    seen: set[tuple[int, int]] = set()
    out = {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        out[name] = t.detach().to("cpu").contiguous()
    return out


def safetensors_files(folder: str | os.PathLike[str]) -> list[Path]:
    """The ``*.safetensors`` files of a checkpoint folder (or the one file given)."""
    path = Path(folder)
    if path.is_file() and path.suffix == ".safetensors":
        return [path]
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        raise WeightUpdateError(
            f"weights path {str(path)!r} is neither a .safetensors file nor a folder with "
            "*.safetensors files; pass a state dict or such a path"
        )
    return files


def read_shapes(folder: str | os.PathLike[str]) -> dict[str, tuple[int, ...]]:
    """Tensor shapes from the safetensors headers under `folder` (no tensor data read)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in safetensors_files(folder):
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        for name, info in header.items():
            if name != "__metadata__":
                shapes[name] = tuple(info["shape"])
    return shapes


def load_weights(weights: WeightsLike) -> dict[str, torch.Tensor]:
    """A state dict from a state dict (type-checked), a ``.safetensors`` file or a folder."""
    if isinstance(weights, Mapping):
        bad = [
            f"{name} ({type(t).__name__})"
            for name, t in weights.items()
            if not isinstance(t, torch.Tensor)
        ]
        if bad:
            raise WeightUpdateError(
                f"weights must be torch tensors; not tensors: {', '.join(bad[:3])}"
                + (", ..." if len(bad) > 3 else "")
            )
        return {str(name): t for name, t in weights.items()}
    if not isinstance(weights, str | os.PathLike):
        raise WeightUpdateError(
            "weights must be a state dict, a .safetensors file or a folder of them "
            f"(got {type(weights).__name__})"
        )
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in safetensors_files(weights):
        state.update(load_file(str(file)))
    return state
