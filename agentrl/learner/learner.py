"""The learner: one ``step(groups)`` = advantages, PPO epochs x minibatches, one new version.

    learner = Learner(model, tokenizer, settings)     # resolve(cfg).learner (agentrl.run.settings)
    metrics = learner.step(groups)                    # blocking; run it in a worker thread
    weights = learner.state_dict_for_sampler()        # publish as version learner.version

Per step:
1. :meth:`Batch.from_groups`; the rewards shaped by the objective (DAPO overlong).
2. One no-grad pass at the start (when needed): the proximal log-probs for ``tis`` /
   ``decoupled`` (not under ``proximal: loglinear``, which interpolates them per
   micro-batch instead, nor when they are the behaviour log-probs or, with one update
   per step, the update's own detached log-probs: see :mod:`agentrl.learner.proximal`),
   the critic's values when the advantage estimator
   needs them, and the exact sampler-vs-learner gap; reference log-probs when a KL term
   is on. Without the pass the gap is measured on the first update's forward instead.
3. Advantages from the registry (:class:`~agentrl.learner.objective.Objective`), from
   per-token rewards when the KL is in the reward; DAPO's overlong filter on the mask.
4. ``ppo_epochs`` x ``minibatches`` optimizer steps; each minibatch is split into
   micro-batches (:mod:`agentrl.learner.batching`) whose gradients accumulate, every
   micro-batch loss divided by the whole minibatch's token / sequence count, so
   accumulation equals one big batch.
5. Gradient clipping, AdamW, the lr schedule (stepped once per learner step), version + 1.

Where and how precisely it computes: :mod:`agentrl.learner.precision`; what it reports:
:mod:`agentrl.learner.metrics`.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from agentrl.algos import loglinear_proximal_logprobs
from agentrl.algos.distill import distill_advantages, reverse_kl
from agentrl.algos.stats import masked_mean
from agentrl.devices import to_device, to_host
from agentrl.errors import ConfigError
from agentrl.learner import compiled
from agentrl.learner.batching import BatchLayout, minibatch_rows
from agentrl.learner.core import CoreSettings, TrainerCore
from agentrl.learner.credit_record import StepCredit, step_credit
from agentrl.learner.critic import ValueHead, ValueModel
from agentrl.learner.distributed import Ranks, rank_micro_batches, whole_rows
from agentrl.learner.forward import PolicyForward
from agentrl.learner.lora import sampler_state
from agentrl.learner.metrics import WeightedMeans, as_floats, batch_metrics
from agentrl.learner.monitors import batch_monitors
from agentrl.learner.objective import Objective
from agentrl.learner.precision import Precision, same_attention_kernel
from agentrl.learner.proximal import bypass_blockers, current_blockers
from agentrl.learner.reference import (
    check_refreshable,
    due,
    load_reference_state,
    reference_state,
    refresh_reference,
)
from agentrl.learner.settings import LearnerSettings
from agentrl.learner.teacher import Teachers
from agentrl.types import Batch, TrajectoryGroup

log = logging.getLogger(__name__)

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


def _pad_id(tokenizer: Any) -> int:
    for attr in ("pad_token_id", "eos_token_id"):
        v = getattr(tokenizer, attr, None)
        if isinstance(v, int):
            return v
    return 0


@dataclass
class _Start:
    """What the start-of-step pass found (None: not computed)."""

    current: bool
    loglinear: bool
    n_updates: int
    prox_lp: Tensor | None = None
    entropy: Tensor | None = None
    old_values: Tensor | None = None
    ref_lp: Tensor | None = None


@dataclass
class _Loop:
    """The update loop's record: updates taken, their losses and gradient norms."""

    updates: int = 0
    grad_norms: list[float] = field(default_factory=list)
    losses: list[Tensor | float] = field(default_factory=list)  # this rank's share
    nonfinite: int = 0
    skipped: int = 0  # fp16 updates the gradient scaler skipped (a gradient overflowed)


@dataclass
class _UpdateInputs:
    """What every micro-batch of a step's updates reads (and the records it appends to)."""

    batch: Batch
    layout: BatchLayout
    loss_mask: Tensor
    advantages: Tensor
    old_lp: Tensor
    ref_lp: Tensor | None
    old_values: Tensor | None
    returns: Tensor | None
    used_old_lp: Tensor
    first_pass_lp: Tensor | None
    # (host target [B, T], rows, length, device values): read in one transfer at the end
    pending: list[tuple[Tensor, Tensor, int, Tensor]]
    means: WeightedMeans
    current: bool
    loglinear: bool
    n_updates: int
    with_entropy: bool = False
    epoch: int = 0
    updates: int = 0
    denominator: Any = None


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
        if settings.model.gradient_checkpointing:
            enable_checkpointing(self.model, traced=traced)
        elif self.lcfg.recompute_mlp:
            from agentrl.learner.recompute import recompute_mlp

            patched = recompute_mlp(self.model)
            log.info("learner.recompute_mlp: %d MLPs keep only their input for backward", patched)
            if not patched:
                log.warning(
                    "learner.recompute_mlp: no gated SiLU MLP with plain bias-free linears in "
                    "this model (LoRA layers, biases and other MLPs are left as they are)"
                )
        self.pad_token_id = _pad_id(tokenizer)
        # learner.world_size ranks (agentrl.learner.distributed); one rank: a no-op
        self.ranks = Ranks.from_settings(self.lcfg)
        if self.ranks.parallel == "fsdp" and self.lcfg.share_prompt:
            # the shared-prompt path calls the decoder outside the FSDP root's forward
            self.lcfg = dataclasses.replace(self.lcfg, share_prompt=False)
        if traced and self.lcfg.share_prompt:
            # the shared prompt's KV cache makes every layer its own graph (guards on the
            # layer index and the cache's state), past dynamo's recompile limit
            self.lcfg = dataclasses.replace(self.lcfg, share_prompt=False)
            log.info("learner.compile: learner.share_prompt is off with compiled layers")
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
        # on-policy distillation: the teachers that score the sampled tokens (distill.*)
        self.teachers: Teachers | None = None
        if settings.distill.enabled:
            if self.alg.dynamic_sampling:
                log.warning(
                    "distill with algorithm.dynamic_sampling: groups whose rewards are all "
                    "equal are dropped, though the teacher's signal in them is not zero; set "
                    "algorithm.dynamic_sampling=false to distil on every group"
                )
            self.teachers = Teachers(
                settings.distill,
                tokenizer,
                device=self.device,
                wrap=lambda m: self.strategy.wrap(m.to(self.device)),
            )
        # after the reference model's copy: a copy of a compiled layer would run the original
        self.compiled_layers = self.core.compile_layers(
            {"policy": self.model, "critic": self.critic, "reference model": self.ref_model},
            backend=self.compile_backend,
        )
        self.generator = torch.Generator().manual_seed(settings.seed if seed is None else seed)
        # why the start-of-step pass may not be skipped (empty: skipped on batches whose
        # trained tokens are all at this learner's version; agentrl.learner.proximal)
        also_needed = [
            what
            for what, on in (
                ("the critic's values", self.use_critic),
                ("the KL in the reward", self.alg.kl_in_reward),
            )
            if on
        ]
        step_settings = dataclasses.replace(settings, train=self.lcfg)
        self.bypass_blockers = bypass_blockers(
            step_settings, self.precision, pass_needed_for=" and ".join(also_needed)
        )
        # why the update's own forward may not give pi_old either (then the pass runs)
        self.current_blockers = current_blockers(
            step_settings, self.model, pass_needed_for=" and ".join(also_needed)
        )
        self.version = 0
        self.step_count = 0
        self.last_credit: StepCredit | None = None  # the last step's advantages per sample
        # the pi_old log-probs the loss used in the last step's first epoch (for inspection)
        self.last_old_logprobs: Tensor | None = None
        # called with each phase of a step as it starts (PHASES): a learner rank reports
        # where it is, so a dead or stuck rank is named with its place in the step
        self.on_phase: Callable[[str], None] | None = None

    def _phase(self, name: str) -> None:
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
        start = self._start_pass(batch, layout, metrics)
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
            advantages = self._distill(groups, batch, layout, advantages, loss_mask, metrics)
        # what each sample trained with, for the trace (the run layer publishes it)
        self.last_credit = step_credit(
            alg.advantage, [t.traj_id for t in batch.trajectories], advantages, loss_mask
        )

        # 4. the update loop
        inputs = _UpdateInputs(
            batch, layout, loss_mask, advantages, old_lp, ref_lp, old_values, returns,
            used_old_lp=torch.zeros(B, T),
            first_pass_lp=torch.zeros(B, T) if prox_lp is None else None,
            pending=[], means=WeightedMeans(), current=start.current,
            loglinear=start.loglinear, n_updates=start.n_updates,
        )  # fmt: skip
        loop = self._update_loop(inputs, start.entropy is None)

        # 5. publish: a new version, the step's metrics (summed over the ranks first)
        self.version += 1
        self.step_count += 1
        self.last_old_logprobs = inputs.used_old_lp
        if self.ref_model is not None and due(self.alg.ref_refresh_every, self.step_count):
            refresh_reference(self.ref_model, self.model)  # algorithm.ref_refresh_every
            metrics["ref/refreshed"] = 1.0
        self._step_metrics(metrics, inputs, loop, start, rewards)
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
        metrics["tokens_per_s"] = metrics["tokens/total"] / max(metrics["time/step_s"], 1e-9)
        return as_floats(metrics)  # the step's device-side metrics read in one transfer

    def _distill(
        self,
        groups: Sequence[TrajectoryGroup],
        batch: Batch,
        layout: BatchLayout,
        advantages: Tensor,
        loss_mask: Tensor,
        metrics: dict[str, Any],
    ) -> Tensor:
        """On-policy distillation's advantages (:mod:`agentrl.learner.teacher`): each row's
        teacher scores its sampled tokens; the reverse KL against the sampler's log-probs
        (the policy that drew them, whatever its version) mixes with the task advantages."""
        assert self.teachers is not None
        d = self.settings.distill
        keys = self.teachers.row_keys(groups)
        self._phase("teacher pass")
        t0 = time.perf_counter()

        def score_local(model: Any, rows: Tensor) -> Tensor:
            return whole_rows(self.forward, model, batch, layout, rows, self.ranks)[0]

        teacher_lp = self.teachers.logprobs(batch, keys, score_local)
        student_lp, mask = batch.behavior_logprobs, loss_mask
        rkl = reverse_kl(student_lp, teacher_lp, mask)
        metrics["distill/reverse_kl"] = float(masked_mean(rkl, mask))
        if len(self.teachers.keys) > 1:
            for key in self.teachers.keys:
                rows = torch.tensor([k == key for k in keys])
                if bool((mask[rows] > 0).any()):
                    metrics[f"distill/reverse_kl/{key}"] = float(masked_mean(rkl[rows], mask[rows]))
        metrics["time/teacher_s"] = time.perf_counter() - t0
        return distill_advantages(
            student_lp,
            teacher_lp,
            mask,
            advantages,
            weight=d.weight,
            reward_weight=d.reward_weight,
        )

    def _start_pass(self, batch: Batch, layout: BatchLayout, metrics: dict[str, Any]) -> _Start:
        """The no-grad pass at the start of a step, when needed (see the module docstring):
        the proximal log-probs, the start entropy, the critic's values; the reference
        log-probs when a KL term is on."""
        alg, lcfg, objective = self.alg, self.lcfg, self.objective
        trained_rows = torch.nonzero(batch.loss_mask.sum(dim=1) > 0).flatten()
        n_updates = lcfg.ppo_epochs * lcfg.minibatches
        loglinear = objective.loglinear
        # kl_in_reward: the KL of the learner's own log-probs, not the sampler's, against pi_ref
        need_prox = (not loglinear and (alg.off_policy != "none" or n_updates > 1)) or (
            self.use_critic or alg.kl_in_reward
        )
        # pi_old is the behaviour policy: every trained token sampled by these weights
        bypass = (
            need_prox
            and not self.bypass_blockers
            and bool((batch.versions[batch.loss_mask > 0] == self.version).all())
        )
        # else, with one update, pi_old is what that update's forward computes (detached)
        current = need_prox and not bypass and not self.current_blockers
        metrics["learner/proximal_bypass"] = float(bypass)
        metrics["learner/proximal_current"] = float(current)
        start = _Start(current=current, loglinear=loglinear, n_updates=n_updates)
        t_fwd = time.perf_counter()
        no_grad_passes = 0  # counted, so a test can prove a pass was skipped
        if need_prox and not bypass and not current and len(trained_rows):
            no_grad_passes += 1
            self._phase("no-grad pass")
            self.model.eval()
            start.prox_lp, start.entropy, start.old_values = whole_rows(
                self.forward,
                self.model,
                batch,
                layout,
                trained_rows,
                self.ranks,
                with_values=self.use_critic,
                with_entropy=not self.objective.entropy_coef,
            )
        if self.ref_model is not None and len(trained_rows):
            no_grad_passes += 1
            self._phase("reference pass")
            start.ref_lp, _, _ = whole_rows(
                self.forward, self.ref_model, batch, layout, trained_rows, self.ranks
            )
        metrics["time/no_grad_pass_s"] = time.perf_counter() - t_fwd
        metrics["learner/no_grad_passes"] = float(no_grad_passes)
        return start

    def _update_loop(self, inputs: _UpdateInputs, measure_entropy: bool) -> _Loop:
        """``ppo_epochs`` x ``minibatches`` updates of the trainer core, each over this
        rank's micro-batches of the minibatch; the lr schedule steps once at the end."""
        lcfg, objective = self.lcfg, self.objective
        batch, loss_mask = inputs.batch, inputs.loss_mask
        trained_rows = torch.nonzero(loss_mask.sum(dim=1) > 0).flatten()
        loop = _Loop()
        self.model.train()
        for epoch in range(lcfg.ppo_epochs):
            perm = trained_rows[torch.randperm(len(trained_rows), generator=self.generator)]
            # entropy through the graph only when it is in the loss or not yet measured
            inputs.with_entropy = bool(objective.entropy_coef) or (measure_entropy and epoch == 0)
            inputs.epoch = epoch
            for mb_rows in minibatch_rows(
                perm, batch.group_index, lcfg.minibatches, objective.couples_group
            ):
                if len(mb_rows) == 0:
                    continue
                inputs.denominator = objective.denominator(loss_mask[mb_rows])
                inputs.updates = loop.updates
                done = self.core.update(
                    rank_micro_batches(inputs.layout, mb_rows, self.ranks),
                    lambda mb, counts: self._micro_batch_loss(inputs, mb, counts),
                    self._phase,
                )
                loop.updates += 1
                if done.grad_norm is not None:
                    loop.grad_norms.append(done.grad_norm)
                else:
                    loop.nonfinite += 1
                loop.skipped += int(done.overflowed)
                loop.losses.append(done.loss)
        pending = inputs.pending
        for (target, idx, L, _), values in zip(
            pending, to_host([p[3] for p in pending]), strict=True
        ):
            target[idx, :L] = values
        self.core.end_step()  # the lr schedule, once per learner step
        self.model.eval()
        return loop

    def _step_metrics(
        self,
        metrics: dict[str, Any],
        inputs: _UpdateInputs,
        loop: _Loop,
        start: _Start,
        rewards: Tensor,
    ) -> None:
        """The step's metrics into `metrics`, summed over the ranks first; the adaptive KL
        adapts from the KL seen on every rank."""
        means, first_pass_lp = inputs.means, inputs.first_pass_lp
        if self.ranks.distributed:
            self._phase("metrics all-reduce")
            means.all_reduce(self.ranks, self.device)
            if first_pass_lp is not None:
                self.ranks.sum_(first_pass_lp, self.device)
            self.ranks.sum_(inputs.used_old_lp, self.device)
        self.objective.end_step(lambda seen: self.ranks.sum_(seen, self.device))
        if loop.losses:
            dev = self.device
            losses = torch.stack([torch.as_tensor(x, device=dev).float() for x in loop.losses])
            for total in self.ranks.sum_(losses, self.device):
                means.add({"loss/total": total}, 1.0)
        metrics.update(means.means())
        if start.entropy is not None:
            metrics.update(self.objective.entropy_metrics(start.entropy, inputs.loss_mask))
        learner_lp = start.prox_lp if start.prox_lp is not None else first_pass_lp
        metrics.update(
            batch_metrics(
                inputs.batch,
                rewards,
                inputs.advantages,
                inputs.loss_mask,
                learner_lp,
                loop.grad_norms,
                self.version - 1,
            )
        )
        metrics["nonfinite_skipped"] = float(loop.nonfinite)
        if self.scaler.is_enabled():
            self.skipped_steps += loop.skipped
            metrics["learner/loss_scale"] = float(self.scaler.get_scale())
            metrics["learner/skipped_steps"] = float(loop.skipped)
        metrics["lr"] = self.core.lr
        metrics["version"] = float(self.version)

    def _micro_batch_loss(self, s: _UpdateInputs, mb: Any, counts: bool) -> Tensor:
        """The loss of one micro-batch of an update (divided by the whole minibatch's
        count), its metrics and log-probs recorded for the step's end."""
        idx, L, P = mb
        dev = self.device
        # host -> device without waiting (pinned); the forward finds the loss positions in
        # the host-side mask, so nothing here reads the device
        self._phase("forward")
        batch, loss_mask = s.batch, s.loss_mask
        m = to_device(loss_mask[idx, :L], dev)
        lp, ent, values = self.forward(
            self.model,
            to_device(batch.input_ids[idx, :L], dev),
            loss_mask[idx, :L],
            with_entropy=s.with_entropy,
            with_values=self.use_critic,
            prefix_len=P,
            lengths=s.layout.lengths[idx],
        )
        behavior = to_device(batch.behavior_logprobs[idx, :L], dev)
        if s.current:  # the weights this one update differentiates
            old = lp.detach()
        elif s.loglinear:  # pi_prox interpolated by version, no forward pass
            old = loglinear_proximal_logprobs(
                behavior,
                lp,
                to_device(batch.versions[idx, :L], dev),
                self.version,
                theta_version=self.version + s.updates / s.n_updates,
            )
        else:
            old = to_device(s.old_lp[idx, :L], dev)
        if s.epoch == 0 and counts:  # read to the host at the step's end
            s.pending.append((s.used_old_lp, idx, L, old.detach().float() * m))
        loss, mb_metrics = self.objective.loss(
            lp,
            ent,
            values,
            mask=m,
            old_logprobs=old,
            behavior_logprobs=behavior,
            advantages=to_device(s.advantages[idx, :L], dev),
            ref_logprobs=_rows(s.ref_lp, idx, L, dev),
            old_values=_rows(s.old_values, idx, L, dev),
            returns=_rows(s.returns, idx, L, dev),
            denominator=s.denominator,
            rows=idx,
        )
        if counts:
            s.means.add(mb_metrics, float(loss_mask[idx, :L].sum()))
            if s.first_pass_lp is not None and s.epoch == 0:
                s.pending.append((s.first_pass_lp, idx, L, lp.detach()))
        return loss

    # --- weights and checkpoints ---    # --- weights and checkpoints -----------------------------------------------------

    def sampler_weights(self) -> dict[str, Tensor]:
        """The policy under the samplers' names on this learner's device: views of the live
        weights, or with LoRA each adapted layer merged (:mod:`agentrl.learner.lora`)."""
        return sampler_state(self.model)

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


def enable_checkpointing(model: Any, *, traced: bool = False) -> None:
    """Activation (gradient) checkpointing on a transformers model: each decoder layer's
    activations are recomputed in backward instead of kept (``model.gradient_checkpointing``),
    non-reentrant, the recompute under the forward's attention kernel. `traced`: the layers
    are compiled (``learner.compile``), their graph holds the recompute with the forward's
    kernels, and torch.compile takes no ``context_fn`` that is not a dispatch mode."""
    kwargs: dict[str, Any] = {"use_reentrant": False}
    if not traced:
        kwargs["context_fn"] = same_attention_kernel
    # transformers 5.2x renamed it (the old name warns); older versions have only the old one
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _rows(x: Tensor | None, rows: Tensor, length: int, device: torch.device) -> Tensor | None:
    """``x[rows, :length]`` on `device`, or None."""
    return None if x is None else to_device(x[rows, :length], device)
