"""``algorithm.ref_refresh_every``: the reference policy becomes the current policy every N
learner steps (the KL then anchors to a recent policy instead of the initial one).

The copy is in place, tensor by tensor, so a compiled or FSDP-sharded reference keeps its
layout (every rank copies its own shards: no collective). A checkpoint carries the
refreshed reference's weights, so a resumed run goes on with the same anchor; a LoRA run's
reference is the policy with its adapters off (no weights of its own) and is refused.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor

from agentrl.errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)


def _tensors(model: Any) -> list[tuple[str, Tensor]]:
    return [*model.named_parameters(), *model.named_buffers()]


def check_refreshable(every: int, ref_model: Any) -> None:
    """A reference with weights of its own (not LoRA's adapters-off view of the policy)."""
    if every and ref_model is not None and not hasattr(ref_model, "named_parameters"):
        raise ConfigError(
            f"algorithm.ref_refresh_every={every}: a LoRA run's reference is the policy "
            "with its adapters off, which has no weights to refresh; merge the adapters "
            "into a new base model between runs instead, or set algorithm.ref_refresh_every=0"
        )


def due(every: int, step: int) -> bool:
    """Whether the reference is refreshed after learner step `step` (1-based)."""
    return every > 0 and step > 0 and step % every == 0


def _sharded(model: Any) -> bool:
    return any(type(t).__name__ == "DTensor" for _, t in _tensors(model))


def _reshard(model: Any) -> None:
    """FSDP2 keeps a root unit's parameters gathered (plain tensors) after a forward: put
    every unit back to its shards, so both models hold the same DTensors."""
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


@torch.no_grad()
def refresh_reference(ref_model: Any, policy: Any) -> None:
    """reference <- policy, in place."""
    if _sharded(ref_model) or _sharded(policy):
        _reshard(ref_model)
        _reshard(policy)
    ref, pol = _tensors(ref_model), _tensors(policy)
    if [t.shape for _, t in ref] != [t.shape for _, t in pol]:
        raise RuntimeError("the reference model's tensors do not match the policy's")
    for (_, r), (_, p) in zip(ref, pol, strict=True):
        r.copy_(p.detach())


def reference_state(ref_model: Any) -> dict[str, Tensor]:
    """The reference's tensors for a checkpoint (on the CPU; a sharded one: this rank's
    local shards are not enough to rebuild it, so it is left out)."""
    if _sharded(ref_model):
        return {}
    return {name: t.detach().to("cpu", copy=True) for name, t in _tensors(ref_model)}


@torch.no_grad()
def load_reference_state(
    ref_model: Any, state: dict[str, Tensor] | None, policy: Any, step: int
) -> None:
    """Restore :func:`reference_state`; a checkpoint without it (written by sharded ranks)
    takes the resumed policy as the reference, with a warning."""
    if not state:
        log.warning(
            "algorithm.ref_refresh_every: the checkpoint holds no reference weights (sharded "
            "ranks); the reference is the resumed policy of step %d, not the one of the last "
            "refresh",
            step,
        )
        refresh_reference(ref_model, policy)
        return
    tensors = dict(_tensors(ref_model))
    if set(tensors) != set(state):
        missing = sorted(set(tensors) - set(state))[:3]
        raise CheckpointError(
            f"the checkpoint's reference weights do not fit this model (missing {missing}): "
            "use the config the run was started with"
        )
    for name, t in tensors.items():
        t.copy_(state[name].to(t.device, t.dtype))
