"""Value functions for PPO with GAE: a head on the policy, or a separate small model.

Alignment follows :mod:`agentrl.types`: ``values[t]`` is V of the state *before* token
``t`` (the prefix ``input_ids[:t]``), read from the hidden state at ``t - 1`` -- the same
shift the learner applies to logits.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn


class ValueHead(nn.Module):
    """A linear value head on a decoder's last hidden state (kept in float32)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1)
        # start near V=0 so early advantages are the rewards themselves
        nn.init.normal_(self.proj.weight, std=1.0 / (hidden_size**0.5) * 1e-2)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.proj(hidden.to(self.proj.weight.dtype)).squeeze(-1)


class ValueModel(nn.Module):
    """A separate critic: a decoder backbone (no LM head) plus a :class:`ValueHead`.

    ``forward(input_ids)`` returns per-position values ``[B, T]`` read at each position
    (unshifted); :func:`shift_values` aligns them with the learner's convention.
    """

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = ValueHead(hidden_size)

    @classmethod
    def from_policy(cls, policy: Any, copy_weights: bool = True) -> ValueModel:
        """A critic with the policy's architecture, initialised from its weights (or fresh)."""
        base = policy.base_model
        backbone = copy.deepcopy(base) if copy_weights else type(base)(base.config)
        backbone = backbone.to(torch.float32)
        return cls(backbone, int(policy.config.hidden_size))

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        kw = {} if position_ids is None else {"position_ids": position_ids}
        out = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kw
        )
        return self.head(out[0])


def shift_values(raw: Tensor) -> Tensor:
    """``raw[:, t]`` read at position t -> values aligned with input_ids (V before token t)."""
    return torch.nn.functional.pad(raw[:, :-1], (1, 0))
