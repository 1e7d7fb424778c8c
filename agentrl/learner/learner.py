"""The learner: one ``step(groups)`` = advantages, PPO epochs x minibatches, one new version.

    learner = Learner(model, tokenizer, settings)     # resolve(cfg).learner (agentrl.run.settings)
    metrics = learner.step(groups)                    # blocking; run it in a worker thread
    weights = learner.state_dict_for_sampler()        # publish as version learner.version

A step's stages, each in its own module:
1. The batch: :meth:`Batch.from_groups`; the rewards shaped by the objective (DAPO overlong).
2. The credit inputs: one no-grad pass at the start when needed (proximal log-probs, the
   critic's values, reference log-probs; :mod:`agentrl.learner.passes`).
3. Advantages from the registry (:class:`~agentrl.learner.objective.Objective`), from
   per-token rewards when the KL is in the reward; DAPO's overlong filter on the mask;
   with distillation, the teacher pass (:mod:`agentrl.learner.passes`).
4. The update loop: ``ppo_epochs`` x ``minibatches`` optimizer steps over accumulated
   micro-batches (:mod:`agentrl.learner.update`); gradient clipping, AdamW and the lr
   schedule on the trainer core (:mod:`agentrl.learner.core`).
5. Publish: version + 1, the reference refreshed when due, the step's metrics.

How it is built from its settings: :mod:`agentrl.learner.build`; where and how precisely
it computes: :mod:`agentrl.learner.precision`; what it reports: :mod:`agentrl.learner.metrics`.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from agentrl.errors import ConfigError
from agentrl.learner import compiled
from agentrl.learner.batching import BatchLayout
from agentrl.learner.build import (
    distill_teachers,
    enable_checkpointing,
    honoured_train_settings,
    pad_token_id,
    pass_blockers,
    save_activation_memory,
)
from agentrl.learner.core import CoreSettings, TrainerCore
from agentrl.learner.credit_record import StepCredit, step_credit
from agentrl.learner.critic import ValueHead, ValueModel
from agentrl.learner.distributed import Ranks
from agentrl.learner.forward import PolicyForward
from agentrl.learner.lora import sampler_state
from agentrl.learner.metrics import WeightedMeans, as_floats
from agentrl.learner.monitors import batch_monitors
from agentrl.learner.objective import Objective
from agentrl.learner.passes import start_pass, teacher_pass
from agentrl.learner.precision import Precision
from agentrl.learner.reference import (
    check_refreshable,
    due,
    load_reference_state,
    reference_state,
    refresh_reference,
)
from agentrl.learner.settings import LearnerSettings
from agentrl.learner.teacher import Teachers
from agentrl.learner.update import UpdateInputs, update_loop, update_metrics
from agentrl.types import Batch, TrajectoryGroup
from agentrl.weights.gate import ThreadGate, WeightGate

# the phases of a step, in order, as :attr:`Learner.on_phase` reports them (forward and
# backward once per micro-batch; the all-reduces with several ranks)
PHASES = (
    "no-grad pass",
    "reference pass",
    "teacher pass",
    "forward",
    "backward",
    "gradient all-reduce",
    "optimizer",
    "metrics all-reduce",
)


class Learner:
    """Trains a causal LM on trajectory groups with the algorithm named in the config."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        settings: LearnerSettings | None = None,
        *,
        ref_model: Any = None,
        critic: ValueModel | None = None,
        seed: int | None = None,
        compile_backend: compiled.Backend = compiled.DEFAULT_BACKEND,
    ) -> None:
        settings = settings or LearnerSettings()
        self.settings = settings
        self.compile_backend = compile_backend  # torch.compile's, for learner.compile
        self.alg = settings.algorithm
        self.lcfg = settings.train
        t = settings.temperature
        self.temperature = float(t) if t and t > 0 else 1.0  # greedy sampling: raw logits
        self.total_steps = settings.total_steps
        self.norm_length = settings.objective.norm_length
        self.tokenizer = tokenizer
        self.objective = Objective.from_settings(settings.objective)
        why = compiled.refusal(self.lcfg.compile, self.lcfg.parallel)
        if why is not None and self.lcfg.compile == "on":  # before a process group exists
            raise ConfigError(why)
        self.precision = Precision.from_settings(self.lcfg)
        self.device = self.precision.device
        self.bf16 = self.precision.bf16

        # float32 master weights; bf16 only inside autocast
        self.model = model.to(device=self.device, dtype=torch.float32)
        self.model.config.use_cache = False
        # compiled layers trace the checkpoint into their graph (agentrl.learner.compiled)
        traced = (
            compiled.wanted(self.lcfg.compile, self.device)
            and why is None
            and bool(compiled.decoder_blocks(self.model))
        )
        save_activation_memory(self.model, settings, traced=traced)
        self.pad_token_id = pad_token_id(tokenizer)
        # learner.world_size ranks (agentrl.learner.distributed); one rank: a no-op
        self.ranks = Ranks.from_settings(self.lcfg)
        self.lcfg = honoured_train_settings(self.lcfg, self.ranks, traced=traced)
        if self.ranks.parallel == "fsdp" and self.objective.use_kl and ref_model is None:
            ref_model = copy.deepcopy(self.model)  # copied whole, sharded on its own below

        self.use_critic = self.objective.needs_critic
        head: ValueHead | None = None
        if critic is not None and settings.model.gradient_checkpointing:
            enable_checkpointing(critic.backbone, traced=traced)
        if self.use_critic and critic is None:
            # initialised from the run's seed, not the process's random state: every rank
            # of a group starts from the same head, as one process would
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(settings.seed if seed is None else seed)
                head = ValueHead(int(self.model.config.hidden_size)).to(self.device)
        # the model, how the ranks hold it, AdamW (the critic with learner.critic_lr), the
        # lr schedule and fp16's loss scaler (agentrl.learner.core)
        self.core = TrainerCore(
            self.model,
            CoreSettings.of(self.lcfg, total_steps=self.total_steps),
            precision=self.precision,
            ranks=self.ranks,
            extra=critic if critic is not None else head,
            extra_lr=self.lcfg.critic_lr or self.lcfg.lr,
            extra_is_head=critic is None,
        )
        self.model, self.strategy = self.core.model, self.core.strategy
        self.critic = self.core.extra if critic is not None else None
        self.value_head = self.core.extra if head is not None else None
        self.optimizer, self.scheduler = self.core.optimizer, self.core.scheduler
        self.scaler = self.core.scaler  # fp16: loss scaling (learner.fp16); else pass-through
        self.skipped_steps = 0  # optimizer steps the scaler skipped on overflow, all steps
        self.forward = PolicyForward(
            self.precision,
            temperature=self.temperature,
            chunk=self.lcfg.logprob_chunk,
            fused=self.lcfg.fused_logprobs,
            value_head=self.value_head,
            critic=self.critic,
            packing=self.lcfg.packing,
        )

        self.ref_model = None
        if self.objective.needs_ref:
            ref = ref_model if ref_model is not None else copy.deepcopy(self.model)
            self.ref_model = self.strategy.wrap(ref.to(self.device).eval().requires_grad_(False))
        check_refreshable(self.alg.ref_refresh_every, self.ref_model)
        self.teachers: Teachers | None = distill_teachers(
            settings,
            tokenizer,
            self.device,
            wrap=lambda m: self.strategy.wrap(m.to(self.device)),
        )
        # after the reference model's copy: a copy of a compiled layer would run the original
        self.compiled_layers = self.core.compile_layers(
            {"policy": self.model, "critic": self.critic, "reference model": self.ref_model},
            backend=self.compile_backend,
        )
        self.generator = torch.Generator().manual_seed(settings.seed if seed is None else seed)
        # why the start-of-step pass may not be skipped, and why the update's own forward
        # may not give pi_old either (agentrl.learner.proximal)
        self.bypass_blockers, self.current_blockers = pass_blockers(
            settings, self.lcfg, self.precision, self.model, use_critic=self.use_critic
        )
        self.version = 0
        self._gate: WeightGate | None = None  # weight_gate() / use_weight_gate()
        self._gate_waited = 0.0  # its write_wait_s at the last step's end
        self.step_count = 0
        self.last_credit: StepCredit | None = None  # the last step's advantages per sample
        # the pi_old log-probs the loss used in the last step's first epoch (for inspection)
        self.last_old_logprobs: Tensor | None = None
        # called with each phase of a step as it starts (PHASES): a learner rank reports
        # where it is, so a dead or stuck rank is named with its place in the step
        self.on_phase: Callable[[str], None] | None = None

    def phase(self, name: str) -> None:
        """Report that the step enters phase `name` (one of :data:`PHASES`) to on_phase."""
        if self.on_phase is not None:
            self.on_phase(name)

    def _critic_module(self) -> torch.nn.Module:
        """The critic model or the value head (trained beside the policy)."""
        assert self.core.extra is not None
        return self.core.extra

    def trained_parameters(self) -> list[Tensor]:
        """Every trained tensor: the policy's and the critic's."""
        return self.core.trained_parameters()

    def layout(self, batch: Batch) -> BatchLayout:
        """How `batch` is cut into micro-batches under this learner's settings."""
        return BatchLayout.of(
            batch,
            self.lcfg.micro_batch_size,
            share_prompt=self.lcfg.share_prompt,
            keep_groups=self.objective.couples_group,
        )

    def warmup(self) -> float:
        """Compile the fused log-prob kernels now (see :mod:`agentrl.algos.fused`) rather
        than inside the first step, on a few positions of a narrow stand-in LM head with
        the real vocabulary; returns the seconds it took (0 when they are not in use)."""
        from agentrl.algos import chunked_logprobs_entropy
        from agentrl.algos import fused as fused_kernels

        mode = self.lcfg.fused_logprobs
        if not fused_kernels.wanted(mode, self.device, torch.float32):
            return 0.0
        t0 = time.perf_counter()
        vocab = int(self.model.get_output_embeddings().weight.shape[0])
        gen = torch.Generator().manual_seed(0)
        weight = torch.randn(vocab, 8, generator=gen).to(self.device)
        # every variant a step can take: with and without entropy, and one chunk (the
        # compiler guards on the labels' base having the chunk's row count) or several
        # (the sizes are all different, so no other size equality gets guarded on)
        for with_entropy in (False, True):
            for rows, chunk in ((5, 16), (11, 6)):
                hidden = torch.randn(rows, 8, generator=gen).to(self.device).requires_grad_()
                labels = torch.randint(0, vocab, (rows,), generator=gen).to(self.device)
                labels[-1] = -100
                with self.precision.autocast():
                    lp, ent = chunked_logprobs_entropy(
                        hidden, weight, labels, chunk=chunk, with_entropy=with_entropy, fused=mode
                    )
                (lp.sum() + ent.sum() if with_entropy else lp.sum()).backward()
        return time.perf_counter() - t0

    @torch.no_grad()
    def compute_logprobs(self, groups_or_batch: Sequence[TrajectoryGroup] | Batch) -> Tensor:
        """Current policy log-probs ``[B, T]`` (aligned with input_ids) on the model tokens."""
        batch = (
            groups_or_batch
            if isinstance(groups_or_batch, Batch)
            else Batch.from_groups(groups_or_batch, pad_token_id=self.pad_token_id)
        )
        rows = torch.nonzero(batch.loss_mask.sum(dim=1) > 0).flatten()
        self.model.eval()
        lp, _, _ = self.forward.whole_rows(self.model, batch, self.layout(batch), rows)
        return lp

    # --- the step ---------------------------------------------------------------------

    def step(self, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        """One training step on `groups`; returns flat float metrics. Blocking.

        The stages: the batch -> the credit inputs (the start-of-step no-grad passes) ->
        advantages -> the update loop (PPO epochs x minibatches on the trainer core) ->
        publish (a new version, the metrics summed over the ranks)."""
        if not groups:
            raise ValueError("Learner.step needs at least one TrajectoryGroup (got none)")
        t0 = time.perf_counter()
        alg, objective = self.alg, self.objective
        # 1. the batch
        batch = Batch.from_groups(groups, pad_token_id=self.pad_token_id)
        layout = self.layout(batch)
        B, T = batch.input_ids.shape
        rewards, metrics = objective.shaped_rewards(batch)
        if alg.entropy_coef_schedule != "constant":
            metrics["entropy_coef"] = objective.begin_step(self.step_count, self.total_steps)

        # 2. credit inputs: proximal log-probs, values, reference log-probs
        start = start_pass(self, batch, layout, metrics)
        prox_lp, old_values, ref_lp = start.prox_lp, start.old_values, start.ref_lp

        # 3. advantages
        old_lp = prox_lp if (alg.off_policy != "none" and prox_lp is not None) else None
        if old_lp is None or start.loglinear:
            old_lp = batch.behavior_logprobs
        kl_rewards: Tensor | None = None  # [B, T]: the outcome with the KL penalty folded in
        if alg.kl_in_reward and ref_lp is not None:
            kl_lp = prox_lp if prox_lp is not None else batch.behavior_logprobs
            kl_rewards, kl_metrics = objective.kl_rewards(batch, rewards, kl_lp, ref_lp)
            metrics.update(kl_metrics)
        advantages, loss_mask, returns = objective.advantages(
            batch, rewards, old_values, token_rewards=kl_rewards
        )
        loss_mask, filter_metrics = objective.filter_truncated(batch, loss_mask)
        metrics.update(filter_metrics)
        if self.teachers is not None:
            advantages = teacher_pass(self, groups, batch, layout, advantages, loss_mask, metrics)
        # what each sample trained with, for the trace (the run layer publishes it)
        self.last_credit = step_credit(
            alg.advantage, [t.traj_id for t in batch.trajectories], advantages, loss_mask
        )

        # 4. the update loop
        inputs = UpdateInputs(
            batch, layout, loss_mask, advantages, old_lp, ref_lp, old_values, returns,
            used_old_lp=torch.zeros(B, T),
            first_pass_lp=torch.zeros(B, T) if prox_lp is None else None,
            pending=[], means=WeightedMeans(), current=start.current,
            loglinear=start.loglinear, n_updates=start.n_updates,
        )  # fmt: skip
        loop = update_loop(self, inputs, start.entropy is None)

        # 5. publish: a new version, the step's metrics (summed over the ranks first)
        self.version += 1
        self.step_count += 1
        if self._gate is not None and self._gate.version != self.version:
            # no update said it (nothing trained, or a non-finite step skipped): the weights
            # a sampler computes on are this version all the same
            with self._gate.writing(self.version):
                pass
        self.last_old_logprobs = inputs.used_old_lp
        if self.ref_model is not None and due(self.alg.ref_refresh_every, self.step_count):
            refresh_reference(self.ref_model, self.model)  # algorithm.ref_refresh_every
            metrics["ref/refreshed"] = 1.0
        update_metrics(self, metrics, inputs, loop, start, rewards)
        if self.scaler.is_enabled():
            self.skipped_steps += loop.skipped
        learner_lp = start.prox_lp if start.prox_lp is not None else inputs.first_pass_lp
        metrics.update(
            batch_monitors(
                batch,
                advantages,
                loss_mask,
                learner_lp,
                self.version - 1,
                ngram=self.settings.monitors.ngram,
            )
        )
        if "entropy" in metrics:
            metrics["monitor/entropy"] = metrics["entropy"]
        metrics["time/step_s"] = time.perf_counter() - t0
        if self._gate is not None:  # a sampler computing on these weights as they train
            waited = self._gate.write_wait_s
            metrics["time/weight_gate_wait_s"] = waited - self._gate_waited
            self._gate_waited = waited
        metrics["tokens_per_s"] = metrics["tokens/total"] / max(metrics["time/step_s"], 1e-9)
        return as_floats(metrics)  # the step's device-side metrics read in one transfer

    # --- weights and checkpoints -----------------------------------------------------

    def sampler_weights(self) -> dict[str, Tensor]:
        """The policy under the samplers' names on this learner's device: views of the live
        weights, or with LoRA each adapted layer merged (:mod:`agentrl.learner.lora`)."""
        return sampler_state(self.model)

    def weight_gate(self) -> WeightGate:
        """The gate a sampler in this process takes around each forward pass while it computes
        on :meth:`sampler_weights` during training (an asynchronous run): this learner's
        optimizer steps and checkpoint loads then wait for the pass under way, and the
        sampler for them (:mod:`agentrl.weights.gate`)."""
        if self._gate is None:
            self.use_weight_gate(ThreadGate(self.version))
        assert self._gate is not None
        return self._gate

    def use_weight_gate(self, gate: WeightGate) -> None:
        """Take `gate` around every write to the weights from now on (a learner process's
        :class:`~agentrl.weights.gate.FileGate`); each step reports the time it waited
        (``time/weight_gate_wait_s``)."""
        self._gate = gate
        self._gate_waited = gate.write_wait_s
        self.core.write_guard = gate.writing
        with gate.writing(self.version):  # the weights as they are now
            pass

    def gathered_sampler_weights(self) -> dict[str, Tensor]:
        """:meth:`sampler_weights` whole: under FSDP gathered from the shards once, kept on
        rank 0 (every rank must call it; the others get ``{}``)."""
        return self.strategy.full_state(self.model, self.sampler_weights())

    def state_dict_for_sampler(self, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
        """The policy weights for the samplers (optionally cast). On CPU a copy, safe to hand
        to another thread; on CUDA the device tensors themselves, so a sampler on a GPU
        copies them device to device: valid until the next :meth:`step`, which the
        orchestrator starts only once the publish has returned."""
        state = self.gathered_sampler_weights()
        if self.device.type == "cuda":
            return {k: v.detach().to(dtype=dtype or v.dtype) for k, v in state.items()}
        return {
            k: v.detach().to("cpu", dtype=dtype or v.dtype, copy=True) for k, v in state.items()
        }

    def save_checkpoint(self, directory: str | Path) -> Path:
        """Model (safetensors), optimizer, scheduler, RNG states, version, step -- atomically
        (:meth:`TrainerCore.save <agentrl.learner.core.TrainerCore.save>`). Several ranks:
        rank 0 writes it (DDP), or every rank its shards."""
        return self.core.save(
            directory,
            state={
                "generator": self.generator.get_state(),
                "objective": self.objective.state_dict(),  # the adaptive-KL beta
                **self._reference_checkpoint(),
            },
            meta={
                "version": self.version,
                "step": self.step_count,
                "advantage": self.alg.advantage,
            },
        )

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore what :meth:`save_checkpoint` wrote (also after a kill mid-save)."""
        state, meta = self.core.load(directory)
        self.generator.set_state(state["generator"])
        self.objective.load_state_dict(state.get("objective") or {})
        self.version = int(meta["version"])
        if self._gate is not None:  # a sampler computing on these weights tags them so
            with self._gate.writing(self.version):
                pass
        self.step_count = int(meta["step"])
        if self._refreshed():  # the reference of the last refresh, not the initial policy
            load_reference_state(
                self.ref_model, state.get("reference"), self.model, self.step_count
            )

    def _refreshed(self) -> bool:
        """Whether algorithm.ref_refresh_every has replaced the initial reference yet."""
        every = self.alg.ref_refresh_every
        return self.ref_model is not None and every > 0 and self.step_count >= every

    def _reference_checkpoint(self) -> dict[str, Any]:
        return {"reference": reference_state(self.ref_model)} if self._refreshed() else {}

    def wait_ready(self) -> None:
        """Ready when constructed (see :class:`~agentrl.learner.LearnerLike`)."""

    def close(self) -> None:
        """The teacher servers' connections (see :class:`~agentrl.learner.LearnerLike`)."""
        if self.teachers is not None:
            self.teachers.close()
