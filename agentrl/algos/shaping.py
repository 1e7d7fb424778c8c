"""DAPO reward shaping for over-long responses."""

from __future__ import annotations

import torch
from torch import Tensor


# DAPO soft overlong punishment (Yu et al. 2025, eq. 13):
# R(y) = 0 if |y| <= L_max - L_cache; ((L_max - L_cache) - |y|) / L_cache if |y| <= L_max; -1 beyond
def overlong_penalty(lengths: Tensor, max_len: int, cache_len: int) -> Tensor:
    """Length penalty ``[B]`` in [-1, 0] to add to the rewards (``cache_len=0``: a hard step)."""
    if max_len <= 0 or cache_len < 0 or cache_len > max_len:
        raise ValueError(
            f"need max_len > 0 and 0 <= cache_len <= max_len (got max_len={max_len}, "
            f"cache_len={cache_len})"
        )
    length = torch.as_tensor(lengths).to(torch.float32)
    start = float(max_len - cache_len)
    if cache_len == 0:
        return torch.where(length > max_len, -torch.ones_like(length), torch.zeros_like(length))
    soft = (start - length) / float(cache_len)
    out = torch.where(length <= start, torch.zeros_like(length), soft)
    return torch.where(length > max_len, -torch.ones_like(length), out)
