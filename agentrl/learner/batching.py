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
    # a group-coupled loss: a micro-batch holds whole groups (several while they fit in
    # micro_batch_size rows; one larger group alone)
    keep_groups: bool = False

    @classmethod
    def of(
        cls, batch: Batch, micro_batch_size: int, *, share_prompt: bool, keep_groups: bool = False
    ) -> BatchLayout:
        shared = shared_prompt_lengths(batch) if share_prompt and batch.trajectories else None
        lengths = batch.attention_mask.sum(dim=1)
        return cls(lengths, batch.group_index, shared, micro_batch_size, keep_groups)

    def micro_batches(self, rows: Tensor) -> Iterator[MicroBatch]:
        """Micro-batches covering `rows`: shared-prompt buckets first, then the rest by length
        (whole groups together under ``keep_groups``)."""
        if self.keep_groups:
            yield from self._group_micro_batches(rows)
            return
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

    def _group_micro_batches(self, rows: Tensor) -> Iterator[MicroBatch]:
        chunk: list[int] = []
        for members in groups_of(rows, self.group_index):
            if chunk and len(chunk) + len(members) > self.micro_batch_size:
                yield self._micro(chunk)
                chunk = []
            chunk.extend(members)
        if chunk:
            yield self._micro(chunk)

    def _micro(self, chunk: list[int]) -> MicroBatch:
        idx = torch.tensor(chunk, dtype=torch.long)
        L = int(self.lengths[idx].max())
        P = 0
        if self.shared_prompt is not None and len(idx) > 1:
            shared = self.shared_prompt[idx]
            same_group = bool((self.group_index[idx] == self.group_index[idx[0]]).all())
            if same_group and bool((shared == shared[0]).all()) and 0 < int(shared[0]) < L:
                P = int(shared[0])
        return MicroBatch(idx, L, P)


def groups_of(rows: Tensor, group_index: Tensor) -> list[list[int]]:
    """`rows` gathered by group, groups in order of first appearance."""
    out: dict[int, list[int]] = {}
    for r in rows.tolist():
        out.setdefault(int(group_index[r]), []).append(r)
    return list(out.values())


def minibatch_rows(rows: Tensor, group_index: Tensor, n: int, keep_groups: bool) -> list[Tensor]:
    """`rows` (already shuffled) cut into `n` minibatches; whole groups under `keep_groups`
    (each minibatch takes about len(rows)/n rows, never part of a group)."""
    if not keep_groups:
        return list(torch.tensor_split(rows, n))
    groups = groups_of(rows, group_index)
    return [
        torch.tensor([r for members in part for r in members], dtype=torch.long)
        for part in _split_list(groups, n)
    ]


def _split_list(items: list[list[int]], n: int) -> list[list[list[int]]]:
    k, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + k + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return out
