"""Comparing two training runs' weights so the comparison holds on every CPU kind."""

from __future__ import annotations

import torch


def flat(model: torch.nn.Module) -> torch.Tensor:
    """Every parameter of `model`, detached, in one vector."""
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def assert_trained_alike(a: torch.Tensor, b: torch.Tensor, start: torch.Tensor) -> None:
    """Two runs' flat weights `a`, `b` agree, measured against how far training moved `b`
    from `start`.

    Not element for element to 1e-6: Adam moves every element by about lr whatever its
    gradient's size, so an element whose gradient is float32 rounding noise can land
    elsewhere under another kernel order (another batch shape, AVX2 vs AVX-512). Nearly
    every element agrees to 1e-5, and the difference is a thousandth of the update."""
    moved = (b - start).norm()
    assert moved > 0, "neither run moved the weights"
    gap = (a - b).norm()
    assert gap <= 1e-3 * moved, f"weights differ by {gap:.3g} (norm), training moved {moved:.3g}"
    off = int(((a - b).abs() > 1e-5 + 1e-4 * b.abs()).sum())
    assert off <= 1e-4 * b.numel(), f"{off} of {b.numel()} weights differ beyond 1e-5"
