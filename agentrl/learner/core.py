"""One training core under every mode: RL, preference (DPO family), SFT, the reward model.

    core = TrainerCore(model, CoreSettings.of(cfg.learner), ranks=Ranks.from_settings(cfg.learner))
    result = core.update(micro_batches, loss_of)   # one optimizer update; loss_of(mb, counts)
    core.end_step()                                # the lr schedule, once per training step
    core.save(folder, state={...}, meta={...}); state, meta = core.load(folder)

The core owns what every mode shares: the model on its device in float32 master weights
(LoRA adapters injected when asked), how the ranks hold it (DDP or FSDP2,
:mod:`agentrl.learner.distributed`), the one AdamW construction, the lr schedule, the
precision (bf16 autocast regions, fp16 loss scaling: :mod:`agentrl.learner.precision`),
compiled decoder layers (:mod:`agentrl.learner.compiled`), the micro-batch (gradient
accumulation) loop with clipping, and the trainer's part of a checkpoint in the run
folder's layout (:mod:`agentrl.runfolder`; sharded: :mod:`agentrl.learner.sharded_checkpoint`).
A mode contributes its batch (the micro-batches it cuts) and its loss over one micro-batch,
already divided by the whole update's count, so accumulation over micro-batches and ranks
sums to the loss of one big batch.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor

from agentrl.errors import CheckpointError, ConfigError
from agentrl.learner import compiled, sharded_checkpoint
from agentrl.learner.distributed import Ranks, Strategy, is_sharded
from agentrl.learner.lora import apply_lora, has_lora, load_policy, sampler_state, save_policy
from agentrl.learner.precision import Precision
from agentrl.learner.schedule import lr_lambda
from agentrl.runfolder import (
    CRITIC_WEIGHTS,
    atomic_directory,
    capture_rng_state,
    read_trainer_meta,
    read_trainer_state,
    resolve_checkpoint,
    restore_rng_state,
    write_trainer_files,
)

log = logging.getLogger(__name__)

MB = TypeVar("MB")


@dataclass(frozen=True)
class CoreSettings:
    """What the core needs of ``learner.*`` (any mode's CLI flags already applied)."""

    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    grad_clip: float | None = 1.0  # None: no clipping (the norm is still measured)
    schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 1
    compile: str = "off"  # learner.compile: auto | on | off

    @classmethod
    def of(cls, lcfg: Any, *, total_steps: int = 1, **overrides: Any) -> CoreSettings:
        """From a ``learner`` config section; `overrides` win (a mode's CLI flags)."""
        values = {
            "lr": lcfg.lr,
            "betas": tuple(lcfg.betas),
            "weight_decay": lcfg.weight_decay,
            "grad_clip": lcfg.grad_clip,
            "schedule": lcfg.schedule,
            "warmup_steps": lcfg.warmup_steps,
            "total_steps": max(int(total_steps), 1),
            "compile": lcfg.compile,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def adamw(
    groups: list[dict[str, Any]], *, lr: float, betas: tuple[float, float], weight_decay: float
) -> torch.optim.AdamW:
    """The optimizer of every trainer: AdamW, fused where torch's fused kernel takes the
    parameters (one kernel per tensor instead of ~10 ops: 0.17 vs 0.9 s a step for
    SmolLM2-135M on 2 CPU cores, and no foreach temporaries)."""
    params = [p for g in groups for p in g["params"]]
    fused = bool(params) and all(
        p.device.type in ("cpu", "cuda")
        and p.dtype in (torch.float32, torch.float16, torch.bfloat16)
        for p in params
    )
    return torch.optim.AdamW(
        groups, lr=lr, betas=tuple(betas), weight_decay=weight_decay, fused=True if fused else None
    )


@dataclass
class Update:
    """One optimizer update: its summed loss (a device tensor, read when the step ends),
    the gradient norm (None when it was not finite: the update was skipped) and whether
    the fp16 scaler skipped it on an overflow."""

    loss: Tensor | float
    grad_norm: float | None
    overflowed: bool = False


class TrainerCore:
    """A model, how it is held and computed, its optimizer, schedule and checkpoints.

    `extra`: a module trained beside the model (the RL critic or value head) with its own
    learning rate `extra_lr`; `extra_is_head`: a small module (sharded as one unit).
    """

    def __init__(
        self,
        model: Any,
        settings: CoreSettings,
        *,
        precision: Precision | None = None,
        ranks: Ranks | None = None,
        lora: Any = None,
        extra: torch.nn.Module | None = None,
        extra_lr: float | None = None,
        extra_is_head: bool = False,
    ) -> None:
        self.settings = settings
        self.precision = precision or Precision(torch.device("cpu"), bf16=False)
        self.device = self.precision.device
        self.ranks = ranks or Ranks()
        if self.ranks.parallel == "fsdp" and lora is not None:
            raise ConfigError(
                "learner.parallel=fsdp shards full weights and model.lora trains adapters: "
                "unset model.lora, or use learner.parallel=ddp"
            )
        why = compiled.refusal(settings.compile, self.ranks.parallel)
        if why is not None and settings.compile == "on":
            raise ConfigError(why)
        if lora is not None:
            # adapters injected in place and everything else frozen: the optimizer takes
            # only the adapters (LoRA's B starts at zero: the first forward is the base's)
            model = apply_lora(model, lora)
        # float32 master weights; bf16 / fp16 only inside autocast
        model = model.to(device=self.device, dtype=torch.float32)
        self.strategy = Strategy(self.ranks, self.device, bf16=self.precision.bf16)
        self.model = self.strategy.wrap(model)
        self.extra: torch.nn.Module | None = None
        if extra is not None:
            extra = extra.to(self.device)
            self.extra = (
                self.strategy.wrap_head(extra) if extra_is_head else self.strategy.wrap(extra)
            )
        groups: list[dict[str, Any]] = [
            {"params": [p for p in self.model.parameters() if p.requires_grad]}
        ]
        if self.extra is not None:
            groups.append({"params": list(self.extra.parameters()), "lr": extra_lr or settings.lr})
        self.optimizer = adamw(
            groups, lr=settings.lr, betas=settings.betas, weight_decay=settings.weight_decay
        )
        # fp16: loss scaling (learner.fp16); a pass-through scaler otherwise
        self.scaler = self.precision.grad_scaler()
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lr_lambda(settings.schedule, settings.warmup_steps, settings.total_steps),
        )
        # taken around every write to the weights (an optimizer step, a checkpoint load)
        # when a sampler computes on them as they train (agentrl.weights.gate)
        # (with the version the weights are once it is done, or None: agentrl.weights.gate)
        self.write_guard: Callable[[int | None], contextlib.AbstractContextManager[Any]] = (
            contextlib.nullcontext
        )

    # --- compiled layers -------------------------------------------------------------

    def compile_layers(
        self, models: dict[str, Any], backend: compiled.Backend = compiled.DEFAULT_BACKEND
    ) -> dict[str, int]:
        """``learner.compile``: the decoder layers of every model named here (policy first),
        compiled in place; how many, by model. A model whose layers were already compiled
        (LoRA's reference is the policy, adapters off) is skipped."""
        mode = self.settings.compile
        if not compiled.wanted(mode, self.device):
            return {}
        why = compiled.refusal(mode, self.ranks.parallel)
        if why is not None:  # auto (on is refused when the core is built)
            log.info("%s: the decoder layers stay eager", why.split("; set", 1)[0])
            return {}
        counts: dict[str, int] = {}
        seen: set[int] = set()
        for what, model in models.items():
            blocks = [] if model is None else compiled.decoder_blocks(model)
            if model is None or (blocks and all(id(b) in seen for b in blocks)):
                continue
            seen.update(id(b) for b in blocks)
            counts[what] = compiled.compile_layers(
                model, mode, self.device, what=f"the {what}", backend=backend
            )
        log.info(
            "learner.compile=%s: %s compiled in place with torch.compile (backend %s); the "
            "first step compiles them",
            mode,
            ", ".join(f"{n} decoder layers of the {what}" for what, n in counts.items() if n)
            or "no layers",
            backend,
        )
        return counts

    # --- the update --------------------------------------------------------------------

    def trained_parameters(self) -> list[Tensor]:
        """Every trained tensor: the model's (and the extra module's)."""
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def update(
        self,
        micro_batches: Iterable[tuple[MB, bool]],
        loss_of: Callable[[MB, bool], Tensor],
        on_phase: Callable[[str], None] | None = None,
        version_after: int | None = None,
    ) -> Update:
        """One optimizer update over this rank's `micro_batches` (``(mb, counts)``;
        ``counts`` False: a padding micro-batch lockstep ranks run, its loss times 0):
        gradients accumulated, summed over the ranks, clipped, one AdamW step (skipped when
        the norm is not finite or fp16 overflowed). `version_after`: the version the weights
        are after this update (the step's last one), for a sampler computing on them."""
        phase = on_phase or (lambda _: None)
        self.optimizer.zero_grad(set_to_none=True)
        total: Tensor | float = 0.0
        # one autocast region per update: each weight is cast once for all of its
        # micro-batches (Precision.casts_once), ended before the weights change
        with self.precision.casts_once():
            for mb, counts in micro_batches:
                loss = loss_of(mb, counts)
                phase("backward")
                if not counts:  # FSDP's collectives, no gradient
                    self.scaler.scale(loss * 0.0).backward()
                    continue
                # a non-finite loss shows as a non-finite gradient norm below, checked
                # once per update: no host synchronisation per micro-batch
                self.scaler.scale(loss).backward()  # scaled up under fp16 only
                total = total + loss.detach()
        params = self.trained_parameters()
        scaled = self.scaler.is_enabled() and any(p.grad is not None for p in params)
        if self.ranks.world_size > 1 and self.ranks.parallel == "ddp":
            phase("gradient all-reduce")
        self.strategy.reduce_gradients(params)  # summed over the ranks (DDP)
        phase("optimizer")
        if scaled:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients
        clip = self.settings.grad_clip if self.settings.grad_clip is not None else float("inf")
        gn = self.strategy.local(torch.nn.utils.clip_grad_norm_(params, clip))
        grad_norm: float | None = None
        if torch.isfinite(gn):  # one synchronisation per optimizer update
            with self.write_guard(version_after):  # a sampler computing on them waits
                if scaled:  # skipped by the scaler when a gradient overflowed
                    self.scaler.step(self.optimizer)
                else:
                    self.optimizer.step()
            grad_norm = float(gn)
        overflowed = False
        if scaled:
            scale = self.scaler.get_scale()
            self.scaler.update()  # halved after an overflow
            overflowed = self.scaler.get_scale() < scale
        self.optimizer.zero_grad(set_to_none=True)
        return Update(total, grad_norm, overflowed)

    def end_step(self) -> None:
        """The lr schedule advances once per training step."""
        with warnings.catch_warnings():
            # a step with nothing to train skips optimizer.step(); the schedule still advances
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
            self.scheduler.step()

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def full_weights(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """`state` with sharded tensors gathered (a collective: every rank calls it); rank 0
        keeps them, the others get ``{}``."""
        return self.strategy.full_state(self.model, state)

    def plain_model(self, fresh: Callable[[], Any]) -> Any:
        """The model as one plain transformers model on the CPU (what an HF folder holds):
        the trained model itself, or with LoRA or shards `fresh()` (a new base model)
        loaded with the merged, gathered weights. A collective with several ranks: rank 0
        gets the model, the others None."""
        if not has_lora(self.model) and not is_sharded(self.model):
            return self.model.to("cpu")
        state = self.full_weights(sampler_state(self.model))
        if not self.ranks.is_main:
            return None
        plain = fresh()
        plain.load_state_dict({k: t.to("cpu") for k, t in state.items()})
        return plain.to("cpu")

    # --- checkpoints -------------------------------------------------------------------

    def save(self, directory: str | Path, *, state: dict[str, Any], meta: dict[str, Any]) -> Path:
        """The trainer's part of a checkpoint, atomically: the model (LoRA: adapter and
        merged policy), the extra module, optimizer, scheduler, scaler, RNG states and the
        mode's `state` (``trainer_state.pt``), the mode's `meta` (``learner.json``). A
        collective with several ranks: rank 0 writes it (DDP), or every rank its shards."""
        meta = {**meta, "critic": self.extra is not None}
        if self.ranks.parallel == "fsdp":
            return sharded_checkpoint.save(self, directory, state, meta)
        if not self.ranks.is_main:  # DDP: the weights and optimizer are rank 0's too
            self.ranks.barrier()
            return Path(directory)
        from safetensors.torch import save_model

        directory = Path(directory)
        with atomic_directory(directory) as tmp:
            save_policy(self.model, tmp)
            if self.extra is not None:
                save_model(self.extra, str(tmp / CRITIC_WEIGHTS))
            write_trainer_files(
                tmp,
                {
                    "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(),
                    "rng": capture_rng_state(),
                    "scaler": self.scaler.state_dict(),  # {} unless fp16
                    **state,
                },
                meta,
            )
        self.ranks.barrier()
        return directory

    def load(self, directory: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
        """Restore what :meth:`save` wrote (also after a kill mid-save, at another world
        size or layout); returns the mode's (state, meta) to restore its own part."""
        from safetensors.torch import load_model

        directory = resolve_checkpoint(directory)
        meta = read_trainer_meta(directory)
        if bool(meta.get("critic")) != (self.extra is not None):
            raise CheckpointError(
                f"checkpoint {directory} was saved with critic={meta.get('critic')} but this "
                f"learner has critic={self.extra is not None}; use the config the run was "
                "started with"
            )
        state = read_trainer_state(directory)
        sharded, shards = self.ranks.parallel == "fsdp", sharded_checkpoint.has_shards(directory)
        if sharded and shards:  # resharded to this world size by DCP
            sharded_checkpoint.load_sharded_into_sharded(self, directory)
        elif sharded:
            sharded_checkpoint.load_whole_into_sharded(self, directory, state["optimizer"])
        else:
            with self.write_guard(None):  # in place: a sampler computing on them waits
                load_policy(self.model, directory, self.device)
            if self.extra is not None:
                load_model(self.extra, str(directory / CRITIC_WEIGHTS), device=str(self.device))
            if shards:  # a sharded trainer's checkpoint: the optimizer by parameter name
                sharded_checkpoint.load_optimizer_from_shards(self, directory)
            else:
                self.optimizer.load_state_dict(state["optimizer"])
        if "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler.is_enabled() and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        restore_rng_state(state["rng"])
        return state, meta
