"""Checkpoints of a sharded learner (``learner.parallel: fsdp``), and resuming across layouts.

A sharded learner's checkpoint folder holds what a single learner's does, so ``agentrl
export`` and a single learner read it as they are:

- ``model.safetensors``: the whole policy, gathered once on rank 0;
- ``trainer_state.pt``: scheduler, RNG states and the mode's own state (no optimizer);
- ``learner.json``: version, step, and the ``world_size`` / ``parallel`` that wrote it;

plus ``sharded/``: the model and AdamW's state as each rank holds them, written by every
rank at once with ``torch.distributed.checkpoint`` (DCP), which reshards on load: a
checkpoint resumes at another world size, and a single or DDP learner resumes from it
(the optimizer read from ``sharded/`` by parameter name). The other way round, a sharded
learner resumes from a single / DDP checkpoint: the whole policy loads into the shards,
the optimizer's per-index state is mapped to parameter names.

Every function here is a collective of the learner group: all ranks call it.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from agentrl.errors import CheckpointError
from agentrl.runfolder import (
    ADAPTER_WEIGHTS,
    SHARDED,
    atomic_directory,
    capture_rng_state,
    write_trainer_files,
)
from agentrl.runfolder import CRITIC_WEIGHTS as CRITIC
from agentrl.runfolder import POLICY_WEIGHTS as POLICY
from agentrl.weights.files import unshared


def _options(**kw: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kw)


def trained(learner: Any) -> torch.nn.Module:
    """The module whose parameters are exactly the optimizer's (`learner`: a
    :class:`~agentrl.learner.core.TrainerCore`): the policy, or with a critic
    (``algorithm.critic``: a value head or a separate critic model) both under one parent,
    as ``policy.*`` and ``critic.*`` (torch's state-dict helpers map an optimizer's state to
    names through one module)."""
    if learner.extra is None:
        return learner.model
    return torch.nn.ModuleDict({"policy": learner.model, "critic": learner.extra})


def save(learner: Any, directory: str | Path, state: dict[str, Any], meta: dict[str, Any]) -> Path:
    """Write a sharded trainer's checkpoint to `directory` (atomically, by rank 0) with the
    mode's `state` and `meta` (`learner`: a :class:`~agentrl.learner.core.TrainerCore`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    directory = Path(directory)
    ranks = learner.ranks
    # every rank writes its shards here first; rank 0 moves them into the atomic folder
    staging = directory.parent / f".{directory.name}.shards"
    if ranks.is_main:
        shutil.rmtree(staging, ignore_errors=True)
    ranks.barrier()
    model_state, optim_state = get_state_dict(trained(learner), learner.optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(staging))
    full = get_model_state_dict(
        learner.model, options=_options(full_state_dict=True, cpu_offload=True)
    )
    critic: dict[str, Tensor] = {}
    if learner.extra is not None:  # whole too, for a single or DDP learner
        critic = get_model_state_dict(
            learner.extra, options=_options(full_state_dict=True, cpu_offload=True)
        )
    # tied weights once, under the first of their names in sorted order (as a single
    # learner writes them): the gathered copies no longer share storage
    tied: dict[int, list[str]] = {}
    for name, p in learner.model.named_parameters(remove_duplicate=False):
        tied.setdefault(id(p), []).append(name)
    dropped = {n for names in tied.values() for n in sorted(names)[1:]}
    full = {k: v for k, v in full.items() if k not in dropped}
    if ranks.is_main:
        from safetensors.torch import save_file

        with atomic_directory(directory) as tmp:
            os.rename(staging, tmp / SHARDED)
            save_file(unshared(dict(sorted(full.items()))), str(tmp / POLICY), {"format": "pt"})
            if critic:
                save_file(unshared(critic), str(tmp / CRITIC), {"format": "pt"})
            write_trainer_files(
                tmp,
                {
                    "scheduler": learner.scheduler.state_dict(),
                    "rng": capture_rng_state(),
                    "scaler": {},
                    **state,
                },
                {**meta, "world_size": ranks.world_size, "parallel": ranks.parallel},
            )
    ranks.barrier()
    return directory


def has_shards(directory: Path) -> bool:
    return (directory / SHARDED).is_dir()


def load_sharded_into_sharded(learner: Any, directory: Path) -> None:
    """Model and optimizer from ``sharded/`` into a sharded learner (any world size)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(trained(learner), learner.optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=str(directory / SHARDED))
    set_state_dict(
        trained(learner),
        learner.optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
    )


def load_optimizer_from_shards(learner: Any, directory: Path) -> None:
    """AdamW's state from ``sharded/`` into a whole (single or DDP) learner, by name."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    optim_state = get_optimizer_state_dict(trained(learner), learner.optimizer)
    state = {"optimizer": optim_state}
    # one process (no group): every shard read here
    no_dist = not torch.distributed.is_initialized()
    with warnings.catch_warnings():  # DCP says it assumes one process: it is one
        warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
        dcp.load(state, checkpoint_id=str(directory / SHARDED), no_dist=no_dist)
    set_optimizer_state_dict(trained(learner), learner.optimizer, state["optimizer"])


def load_whole_into_sharded(learner: Any, directory: Path, optimizer: dict[str, Any]) -> None:
    """A single / DDP checkpoint (whole policy, per-index optimizer state) into a sharded
    learner: every rank reads the file and keeps its shards."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    if (directory / ADAPTER_WEIGHTS).is_file():
        raise CheckpointError(
            f"checkpoint {directory} holds a LoRA adapter; learner.parallel=fsdp trains full "
            "weights: resume with the config the run was started with"
        )
    state = load_file(str(directory / POLICY))
    if learner.extra is not None:
        state = {f"policy.{k}": v for k, v in state.items()}
        state.update({f"critic.{k}": v for k, v in load_file(str(directory / CRITIC)).items()})
    module = trained(learner)
    set_model_state_dict(module, state, options=_options(full_state_dict=True, strict=False))
    set_optimizer_state_dict(
        module,
        learner.optimizer,
        by_name(module, optimizer),
        options=_options(full_state_dict=True),
    )


def by_name(model: torch.nn.Module, optimizer: dict[str, Any]) -> dict[str, Any]:
    """``optimizer.state_dict()`` of a whole learner (state keyed by parameter index, in the
    order of the trained parameters) keyed by parameter name instead."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    index: dict[int, str] = {}
    groups = []
    for group in optimizer["param_groups"]:
        params = group["params"]
        if len(index) + len(params) > len(names):
            raise CheckpointError(
                "the checkpoint's optimizer trains more tensors than this policy has: resume "
                "with the model the run was started with"
            )
        for i in params:
            index[i] = names[len(index)]
        groups.append({**group, "params": [index[i] for i in params]})
    state: dict[str, Tensor] = {index[i]: s for i, s in optimizer["state"].items()}
    return {"state": state, "param_groups": groups}
