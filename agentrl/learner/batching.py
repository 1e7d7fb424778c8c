"""How a step's rows are cut into micro-batches: by shared prompt, else by length.

Every micro-batch is trimmed to its longest row. With ``learner.share_prompt`` the rows
of one group that share their prompt go together, so the prompt is forwarded once per
micro-batch (see :func:`~agentrl.learner.forward.shared_prefix_logprobs`); other rows are
sorted by length to minimise padding.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from agentrl.types import Batch


class MicroBatch(NamedTuple):
    rows: Tensor  # LongTensor of row indices into the batch
    length: int  # tokens kept per row (the longest row's length)
    shared_prefix: int  # leading tokens all rows share, forwarded once (0: none)


def shared_prompt_lengths(batch: Batch) -> Tensor:
    """Per row, the length of the prompt it shares with the rest of its group (0: none)."""
    prefix = torch.zeros(batch.size, dtype=torch.long)
    first: dict[tuple[int, int], int] = {}
    for r, traj in enumerate(batch.trajectories):
        P = traj.prompt_length
        if P <= 0:
            continue
        ref = first.setdefault((int(batch.group_index[r]), P), r)
        if ref == r or torch.equal(batch.input_ids[r, :P], batch.input_ids[ref, :P]):
            prefix[r] = P
    return prefix


@dataclass(frozen=True)
class BatchLayout:
    """A batch's row lengths and shared prompts, and the micro-batches they make."""

    lengths: Tensor  # [B] real tokens per row
    group_index: Tensor  # [B]
    shared_prompt: Tensor | None  # [B] from shared_prompt_lengths; None: sharing is off
    micro_batch_size: int

    @classmethod
    def of(cls, batch: Batch, micro_batch_size: int, *, share_prompt: bool) -> BatchLayout:
        shared = shared_prompt_lengths(batch) if share_prompt and batch.trajectories else None
        lengths = batch.attention_mask.sum(dim=1)
        return cls(lengths, batch.group_index, shared, micro_batch_size)

    def micro_batches(self, rows: Tensor) -> Iterator[MicroBatch]:
        """Micro-batches covering `rows`: shared-prompt buckets first, then the rest by length."""
        size, lengths = self.micro_batch_size, self.lengths
        buckets: dict[tuple[int, int], list[int]] = {}
        loose: list[int] = []
        for r in rows.tolist():
            P = int(self.shared_prompt[r]) if self.shared_prompt is not None else 0
            if P > 0:
                buckets.setdefault((int(self.group_index[r]), P), []).append(r)
            else:
                loose.append(r)
        for (_, P), members in buckets.items():
            members.sort(key=lambda r: -int(lengths[r]))
            for i in range(0, len(members), size):
                idx = torch.tensor(members[i : i + size], dtype=torch.long)
                L = int(lengths[idx].max())
                yield MicroBatch(idx, L, P if len(idx) > 1 and P < L else 0)
        if loose:
            order = torch.tensor(loose, dtype=torch.long)
            order = order[torch.argsort(lengths[order], descending=True, stable=True)]
            for i in range(0, len(order), size):
                idx = order[i : i + size]
                yield MicroBatch(idx, int(lengths[idx].max()), 0)
