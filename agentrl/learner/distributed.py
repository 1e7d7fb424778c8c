"""The learner on several ranks: one ``torch.distributed`` group, DDP or FSDP2, one update.

    init_rank_group(rank=r, world_size=n, address="tcp://10.0.0.1:29500", timeout_s=600)
    learner = Learner(model, tokenizer, settings)  # settings.train.world_size == n; same on every rank
    metrics = learner.step(groups)               # every rank gets the step's whole list of groups

Every rank sees the whole batch, so each computes the same advantages, the same minibatch
permutation and the same loss denominators (token-mean's token count, seq-mean's sequence
count, Dr.GRPO's constant): they are global over the step by construction, with nothing to
exchange. A minibatch's rows are then split among the ranks by whole groups
(:func:`share_rows`: a group-coupled loss or an ARPO tree stays on one rank), each rank
cuts its share into micro-batches, and the micro-batch losses, each divided by the whole
minibatch's count, sum over micro-batches and ranks to the loss one process computes. So the
gradients are *summed* across ranks, not averaged:

- ``learner.parallel: ddp``: every rank holds the whole model; after the micro-batches the
  gradients are summed with an all-reduce in buckets (:meth:`Strategy.reduce_gradients`).
- ``learner.parallel: fsdp``: torch's FSDP2 (``fully_shard``) on every decoder layer and on
  the root (embeddings, final norm and a tied LM head together), so parameters, gradients
  and AdamW's state are sharded ``1/n`` per rank; gradients reduce-scattered with a divide
  factor of 1 (a sum); bf16 compute through its ``MixedPrecisionPolicy`` with float32
  reduction; ``learner.cpu_offload`` keeps the sharded parameters, gradients and
  optimizer state in host memory (``CPUOffloadPolicy``). Every FSDP forward is a
  collective, so every rank runs the same number of micro-batches: a rank with fewer runs
  padding micro-batches whose loss is multiplied by 0.

The no-grad pass at the start of a step (proximal / reference log-probs, values) is split
the same way and its ``[B, T]`` results summed across ranks. Metrics are summed across
ranks before they are read. Every collective runs under the group's timeout
(``learner.collective_timeout_s``, :func:`set_collective_timeout`), so a dead or stuck rank
is an error, never a hang.
"""

from __future__ import annotations

import datetime
import logging
import os
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from agentrl.devices import to_device
from agentrl.errors import ConfigError
from agentrl.learner.batching import BatchLayout, MicroBatch
from agentrl.learner.settings import TrainSettings
from agentrl.types import Batch

log = logging.getLogger(__name__)

# gradients summed per all-reduce: few collectives, a bounded flat copy
BUCKET_BYTES = 32 * 2**20


def backend_for(device: torch.device) -> str:
    """The collective backend of a learner on `device`: NCCL on CUDA, gloo on CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


def init_rank_group(
    rank: int,
    world_size: int,
    address: str,
    *,
    device: torch.device,
    timeout_s: float,
) -> None:
    """Join the learner's process group (``address``: ``tcp://host:port`` of rank 0's store).

    On CUDA each rank computes on ``cuda:LOCAL_RANK`` (the launcher sets ``LOCAL_RANK``;
    a Ray actor sees only its own GPU, so 0)."""
    if dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(
        backend_for(device),
        init_method=address,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def leave_rank_group() -> None:
    """Leave the learner's process group, if this process joined one: every rank waits at a
    barrier first, so no rank tears its sockets down while a peer is still finishing its
    last collective or writing its results (a peer's gloo thread then aborts the process
    with "terminate called without an active exception")."""
    if not dist.is_initialized():
        return
    if dist.get_world_size() > 1:
        dist.barrier()
    dist.destroy_process_group()


def set_collective_timeout(timeout_s: float) -> None:
    """How long each collective of the learner group waits from now on before it fails
    (``learner.collective_timeout_s``): set once every rank has loaded, so the ranks meet
    and load under the longer start timeout. A rank that stops taking part (hung, stopped)
    makes its peers' collective fail after this long; one that dies fails it at once (its
    sockets close)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        from torch.distributed.distributed_c10d import _set_pg_timeout

        _set_pg_timeout(datetime.timedelta(seconds=timeout_s))


@dataclass(frozen=True)
class Ranks:
    """This process's place in the learner group (world size 1: a single learner)."""

    rank: int = 0
    world_size: int = 1
    parallel: str = "ddp"  # learner.parallel
    cpu_offload: bool = False  # learner.cpu_offload (fsdp)

    @classmethod
    def from_settings(cls, lcfg: TrainSettings) -> Ranks:
        """The group of ``learner.world_size`` ranks this process joined (it must have:
        :func:`init_rank_group`), or one rank."""
        world = int(lcfg.world_size)
        parallel = str(lcfg.parallel)
        offload = bool(lcfg.cpu_offload)
        if world == 1 and parallel != "fsdp":
            return cls(parallel=parallel)
        if not dist.is_initialized():
            if world == 1:  # FSDP2 on one rank (the GPU check): a group of one, in memory
                # learner.device, resolved with the settings
                device = torch.device("cuda" if str(lcfg.device).startswith("cuda") else "cpu")
                dist.init_process_group(
                    backend_for(device), store=dist.HashStore(), rank=0, world_size=1
                )
                return cls(0, 1, parallel, offload)
            raise ConfigError(
                f"learner.world_size={world} but this process joined no torch.distributed "
                "group: start training through the run layer (agentrl train), which launches "
                "the ranks, or set learner.world_size=1"
            )
        if dist.get_world_size() != world:
            raise ConfigError(
                f"learner.world_size={world} but the process group has "
                f"{dist.get_world_size()} ranks; start as many ranks as learner.world_size"
            )
        return cls(dist.get_rank(), world, parallel, offload)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 or self.parallel == "fsdp"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def lockstep(self) -> bool:
        """Whether every rank must run the same number of forwards (FSDP's all-gathers)."""
        return self.parallel == "fsdp" and self.world_size > 1

    # --- collectives ------------------------------------------------------------------

    def sum_(self, tensor: Tensor, device: torch.device) -> Tensor:
        """`tensor` summed over the ranks, in place (through `device` for NCCL)."""
        if self.world_size == 1:
            return tensor
        if backend_for(device) == "nccl" and tensor.device.type != "cuda":
            moved = tensor.to(device)
            dist.all_reduce(moved)
            tensor.copy_(moved.cpu())
        else:
            dist.all_reduce(tensor)
        return tensor

    def union(self, keys: Iterable[str]) -> list[str]:
        """The sorted union of every rank's `keys` (metric names)."""
        mine = sorted(set(keys))
        if self.world_size == 1:
            return mine
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, mine)
        return sorted({k for ks in gathered for k in ks})

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()


# --- who trains what ----------------------------------------------------------------------


def share_rows(layout: BatchLayout, rows: Tensor, world_size: int) -> list[Tensor]:
    """`rows` split among `world_size` ranks by whole groups, balanced by tokens.

    Deterministic (the same on every rank): groups by decreasing token count, each to the
    rank with the fewest tokens so far (lowest rank on ties)."""
    if world_size == 1:
        return [rows]
    members: dict[int, list[int]] = {}
    for r in rows.tolist():
        members.setdefault(int(layout.group_index[r]), []).append(r)
    tokens = {g: int(layout.lengths[rs].sum()) for g, rs in members.items()}
    load = [0] * world_size
    shares: list[list[int]] = [[] for _ in range(world_size)]
    for g in sorted(members, key=lambda g: (-tokens[g], g)):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        shares[rank].extend(members[g])
        load[rank] += tokens[g]
    # each share in the order the rows came (the minibatch's permutation)
    position = {r: i for i, r in enumerate(rows.tolist())}
    return [torch.tensor(sorted(s, key=position.__getitem__), dtype=torch.long) for s in shares]


def rank_micro_batches(
    layout: BatchLayout, rows: Tensor, ranks: Ranks
) -> Iterator[tuple[MicroBatch, bool]]:
    """This rank's micro-batches of `rows` as ``(micro_batch, counts)``; ``counts`` is False
    for a padding micro-batch (lockstep ranks: its loss is multiplied by 0)."""
    if not ranks.distributed:
        for mb in layout.micro_batches(rows):
            yield mb, True
        return
    shares = share_rows(layout, rows, ranks.world_size)
    mine = list(layout.micro_batches(shares[ranks.rank])) if len(shares[ranks.rank]) else []
    yield from ((mb, True) for mb in mine)
    if ranks.lockstep and len(rows):
        most = max(sum(1 for _ in layout.micro_batches(s)) if len(s) else 0 for s in shares)
        # the shortest row of the minibatch, forwarded whole (its mask is real, its loss x 0)
        shortest = rows[torch.argmin(layout.lengths[rows])].reshape(1)
        pad = MicroBatch(shortest, int(layout.lengths[shortest].max()), 0)
        for _ in range(most - len(mine)):
            yield pad, False


@torch.no_grad()
def whole_rows(
    forward: Any,
    model: Any,
    batch: Batch,
    layout: BatchLayout,
    rows: Tensor,
    ranks: Ranks,
    *,
    with_values: bool = False,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """:meth:`PolicyForward.whole_rows` with the rows split among the ranks and the
    ``[B, T]`` results summed (each row is computed by exactly one rank)."""
    if not ranks.distributed:
        return forward.whole_rows(
            model, batch, layout, rows, with_values=with_values, with_entropy=with_entropy
        )
    B, T = batch.input_ids.shape
    out = torch.zeros(1 + with_entropy + with_values, B, T)
    device = forward.precision.device
    for (idx, L, P), counts in rank_micro_batches(layout, rows, ranks):
        parts = forward(
            model,
            to_device(batch.input_ids[idx, :L], device),
            batch.loss_mask[idx, :L],  # on the host: see forward.selected_positions
            with_entropy=with_entropy,
            with_values=with_values,
            prefix_len=P,
            lengths=layout.lengths[idx],
        )
        if counts:
            kept = [p for p in parts if p is not None]
            for i, part in enumerate(kept):
                out[i, idx, :L] = part.cpu()
    ranks.sum_(out, device)
    lp = out[0]
    ent = out[1] if with_entropy else None
    values = out[1 + with_entropy] if with_values else None
    return lp, ent, values


# --- how the model is held ------------------------------------------------------------------


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The decoder layers of a transformers model: the first ``layers`` ModuleList
    (``model.model.layers`` of a causal LM, also under a peft wrapper or in a critic)."""
    for name, module in model.named_modules():
        last = name.split(".")[-1]
        if last == "layers" and isinstance(module, torch.nn.ModuleList) and len(module):
            return list(module)
    raise ConfigError(
        "learner.parallel=fsdp shards each decoder layer but found no `layers` ModuleList "
        f"in {type(model).__name__}; use learner.parallel=ddp for this model"
    )


def is_sharded(model: Any) -> bool:
    """Whether `model` is held by FSDP2 (``fully_shard``)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _summed_gradients(model: torch.nn.Module) -> None:
    """Every FSDP2 unit of `model` sums its gradients over the ranks (divide factor 1, a
    plain SUM: gloo has no pre-multiplied sum): the micro-batch losses are already divided
    by the step's global counts."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


class Strategy:
    """How the ranks hold the model and combine gradients (``learner.parallel``)."""

    def __init__(self, ranks: Ranks, device: torch.device, *, bf16: bool) -> None:
        self.ranks = ranks
        self.device = device
        self.bf16 = bf16

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """`model` as the ranks hold it (FSDP2: sharded in place)."""
        if self.ranks.parallel != "fsdp":
            return model
        from torch.distributed.fsdp import fully_shard

        # transformers' layers return views (never changed in place here); FSDP2 warns
        # about every one of them on every forward
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view")
        kwargs = self._fsdp_kwargs()
        for layer in decoder_layers(model):
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)  # embeddings, norm and a tied LM head: one unit
        _summed_gradients(model)
        return model

    def wrap_head(self, module: torch.nn.Module) -> torch.nn.Module:
        """A small module trained beside the policy (the value head) held the same way."""
        if self.ranks.parallel != "fsdp":
            return module
        from torch.distributed.fsdp import fully_shard

        fully_shard(module, **self._fsdp_kwargs())
        _summed_gradients(module)
        return module

    def _fsdp_kwargs(self) -> dict[str, Any]:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

        # float32 master weights; bf16 compute where the learner computes in bf16, with
        # gradients reduced in float32 (autocast runs on top, as on one rank)
        mp = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16 if self.bf16 else None, reduce_dtype=torch.float32
        )
        offload = CPUOffloadPolicy() if self.ranks.cpu_offload else OffloadPolicy()
        return {"mp_policy": mp, "offload_policy": offload}

    def reduce_gradients(self, params: list[Tensor]) -> None:
        """Sum the gradients over the ranks (DDP; FSDP2 reduce-scatters in backward)."""
        if self.ranks.world_size == 1 or self.ranks.parallel == "fsdp":
            return
        for p in params:
            if p.grad is None:  # a rank that trained nothing still takes part
                p.grad = torch.zeros_like(p)
        bucket: list[Tensor] = []
        size = 0
        for p in params:
            bucket.append(p.grad)
            size += p.grad.numel() * p.grad.element_size()
            if size >= BUCKET_BYTES:
                self._sum_bucket(bucket)
                bucket, size = [], 0
        if bucket:
            self._sum_bucket(bucket)

    def _sum_bucket(self, grads: list[Tensor]) -> None:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    @staticmethod
    def local(t: Tensor) -> Tensor:
        """A DTensor (FSDP2's gradient norm) as a full plain tensor; others as they are."""
        full = getattr(t, "full_tensor", None)
        return full() if full is not None else t

    def full_state(self, model: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """`state` (the policy under sampler names) with sharded tensors gathered: a
        collective (every rank calls it); rank 0 keeps the full tensors, the others get
        an empty dict."""
        if not is_sharded(model):
            return state
        out: dict[str, Tensor] = {}
        for name, t in state.items():
            full = self.local(t)  # an all-gather per tensor: every rank takes part
            if self.ranks.is_main:
                out[name] = full
        return out
