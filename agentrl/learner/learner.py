"""The learner: one ``step(groups)`` = advantages, PPO epochs x minibatches, one new version.

    learner = Learner(model, tokenizer, cfg)          # cfg: agentrl.config.Config
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
import json
import logging
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from agentrl.algos import loglinear_proximal_logprobs
from agentrl.run.checkpoint_files import (
    atomic_directory,
    capture_rng_state,
    resolve_checkpoint,
    restore_rng_state,
)
from agentrl.config import AlgorithmConfig, Config, LearnerConfig
from agentrl.devices import to_device, to_host
from agentrl.errors import CheckpointError, ConfigError
from agentrl.learner import compiled, sharded_checkpoint
from agentrl.learner.batching import BatchLayout, minibatch_rows
from agentrl.learner.credit_record import StepCredit, step_credit
from agentrl.learner.critic import ValueHead, ValueModel
from agentrl.learner.distributed import Ranks, Strategy, rank_micro_batches, whole_rows
from agentrl.learner.forward import PolicyForward
from agentrl.learner.lora import load_policy, sampler_state, save_policy
from agentrl.learner.metrics import WeightedMeans, as_floats, batch_metrics
from agentrl.learner.objective import Objective
from agentrl.learner.precision import Precision, same_attention_kernel
from agentrl.learner.proximal import bypass_blockers, current_blockers
from agentrl.learner.schedule import lr_lambda
from agentrl.types import Batch, TrajectoryGroup

log = logging.getLogger(__name__)

# the phases of a step, in order, as :attr:`Learner.on_phase` reports them (forward and
# backward once per micro-batch; the all-reduces with several ranks)
PHASES = (
    "no-grad pass",
    "reference pass",
    "forward",
    "backward",
    "gradient all-reduce",
    "optimizer",
    "metrics all-reduce",
)


def _fused_adamw_supported(groups: list[dict[str, Any]]) -> bool | None:
    """Whether torch's fused AdamW takes these parameters (floating point, on a CPU or a
    CUDA device); None leaves torch's default."""
    params = [p for g in groups for p in g["params"]]
    ok = bool(params) and all(
        p.device.type in ("cpu", "cuda")
        and p.dtype in (torch.float32, torch.float16, torch.bfloat16)
        for p in params
    )
    return True if ok else None


def _pad_id(tokenizer: Any) -> int:
    for attr in ("pad_token_id", "eos_token_id"):
        v = getattr(tokenizer, attr, None)
        if isinstance(v, int):
            return v
    return 0


class Learner:
    """Trains a causal LM on trajectory groups with the algorithm named in the config."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        cfg: Config | None = None,
        *,
        algorithm: AlgorithmConfig | None = None,
        learner: LearnerConfig | None = None,
        ref_model: Any = None,
        critic: ValueModel | None = None,
        temperature: float | None = None,
        total_steps: int | None = None,
        max_tokens: int | None = None,
        seed: int | None = None,
    ) -> None:
        cfg = cfg or Config()
        self.alg = algorithm or cfg.algorithm
        self.lcfg = learner or cfg.learner
        t = cfg.sampler.temperature if temperature is None else temperature
        self.temperature = float(t) if t and t > 0 else 1.0  # greedy sampling: raw logits
        self.total_steps = total_steps or cfg.orchestrator.max_steps
        self.norm_length = self.alg.norm_length or max_tokens or cfg.rollout.max_tokens
        self.tokenizer = tokenizer
        self.objective = Objective(
            self.alg,
            attribution=cfg.rollout.branching.attribution,
            norm_length=self.norm_length,
            step_weight=cfg.reward.step_weight,
        )
        why = compiled.refusal(self.lcfg.compile, self.lcfg.parallel)
        if why is not None and self.lcfg.compile == "on":  # before a process group exists
            raise ConfigError(why)
        self.precision = Precision.from_config(self.lcfg)
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
        if cfg.model.gradient_checkpointing:
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
        self.ranks = Ranks.from_config(self.lcfg)
        self.strategy = Strategy(self.ranks, self.device, bf16=self.bf16)
        if self.ranks.parallel == "fsdp" and self.lcfg.share_prompt:
            # the shared-prompt path calls the decoder outside the FSDP root's forward
            self.lcfg = self.lcfg.model_copy(update={"share_prompt": False})
        if traced and self.lcfg.share_prompt:
            # the shared prompt's KV cache makes every layer its own graph (guards on the
            # layer index and the cache's state), past dynamo's recompile limit
            self.lcfg = self.lcfg.model_copy(update={"share_prompt": False})
            log.info("learner.compile: learner.share_prompt is off with compiled layers")
        if self.ranks.parallel == "fsdp" and self.objective.use_kl and ref_model is None:
            ref_model = copy.deepcopy(self.model)  # copied whole, sharded on its own below
        self.model = self.strategy.wrap(self.model)

        self.use_critic = self.objective.needs_critic
        self.critic = critic.to(self.device) if critic is not None else None
        if self.critic is not None and cfg.model.gradient_checkpointing:
            enable_checkpointing(self.critic.backbone, traced=traced)
        if self.critic is not None:
            self.critic = self.strategy.wrap(self.critic)
        self.value_head: ValueHead | None = None
        if self.use_critic and self.critic is None:
            # initialised from the run's seed, not the process's random state: every rank
            # of a group starts from the same head, as one process would
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(cfg.orchestrator.seed if seed is None else seed)
                head = ValueHead(int(self.model.config.hidden_size)).to(self.device)
            self.value_head = self.strategy.wrap_head(head)
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
        # after the reference model's copy: a copy of a compiled layer would run the original
        self.compiled_layers = self._compile_layers()

        groups = [{"params": [p for p in self.model.parameters() if p.requires_grad]}]
        if self.use_critic:
            critic_lr = self.lcfg.critic_lr or self.lcfg.lr
            groups.append({"params": list(self._critic_module().parameters()), "lr": critic_lr})
        self.optimizer = torch.optim.AdamW(
            groups,
            lr=self.lcfg.lr,
            betas=tuple(self.lcfg.betas),
            weight_decay=self.lcfg.weight_decay,
            # one kernel per tensor instead of ~10 ops: 0.17 vs 0.9 s a step for SmolLM2-135M
            # on 2 CPU cores, and no foreach temporaries
            fused=_fused_adamw_supported(groups),
        )
        # fp16: loss scaling (learner.fp16); a pass-through scaler otherwise
        self.scaler = self.precision.grad_scaler()
        self.skipped_steps = 0  # optimizer steps the scaler skipped on overflow, all steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lr_lambda(self.lcfg.schedule, self.lcfg.warmup_steps, self.total_steps),
        )
        self.generator = torch.Generator().manual_seed(
            cfg.orchestrator.seed if seed is None else seed
        )
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
        step_cfg = cfg.model_copy(update={"algorithm": self.alg, "learner": self.lcfg})
        self.bypass_blockers = bypass_blockers(
            step_cfg, self.precision, pass_needed_for=" and ".join(also_needed)
        )
        # why the update's own forward may not give pi_old either (then the pass runs)
        self.current_blockers = current_blockers(
            step_cfg, self.model, pass_needed_for=" and ".join(also_needed)
        )
        self.version = 0
        self.step_count = 0
        self.last_credit: StepCredit | None = None  # the last step's advantages per sample
        # the pi_old log-probs the loss used in the last step's first epoch (for inspection)
        self.last_old_logprobs: Tensor | None = None
        # called with each phase of a step as it starts (PHASES): a learner rank reports
        # where it is, so a dead or stuck rank is named with its place in the step
        self.on_phase: Callable[[str], None] | None = None

    def _compile_layers(self) -> dict[str, int]:
        """``learner.compile``: the decoder layers of every model this learner forwards,
        compiled in place (:mod:`agentrl.learner.compiled`); how many, by model."""
        mode = self.lcfg.compile
        if not compiled.wanted(mode, self.device):
            return {}
        why = compiled.refusal(mode, self.ranks.parallel)
        if why is not None:  # auto (on is refused at the start of __init__)
            log.info("%s: the decoder layers stay eager", why.split("; set", 1)[0])
            return {}
        counts: dict[str, int] = {}
        seen: set[int] = set()  # LoRA's reference is the policy itself, adapters off
        models = {"policy": self.model, "critic": self.critic, "reference model": self.ref_model}
        for what, model in models.items():
            blocks = [] if model is None else compiled.decoder_blocks(model)
            if model is None or (blocks and all(id(b) in seen for b in blocks)):
                continue
            seen.update(id(b) for b in blocks)
            counts[what] = compiled.compile_layers(model, mode, self.device, what=f"the {what}")
        log.info(
            "learner.compile=%s: %s compiled in place with torch.compile (backend %s); the "
            "first step compiles them",
            mode,
            ", ".join(f"{n} decoder layers of the {what}" for what, n in counts.items() if n)
            or "no layers",
            compiled.BACKEND,
        )
        return counts

    def _phase(self, name: str) -> None:
        if self.on_phase is not None:
            self.on_phase(name)

    def _critic_module(self) -> torch.nn.Module:
        module = self.critic if self.critic is not None else self.value_head
        assert module is not None
        return module

    def trained_parameters(self) -> list[Tensor]:
        """Every trained tensor: the policy's and the critic's."""
        return [p for g in self.optimizer.param_groups for p in g["params"]]

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
        """One training step on `groups`; returns flat float metrics. Blocking."""
        if not groups:
            raise ValueError("Learner.step needs at least one TrajectoryGroup (got none)")
        t0 = time.perf_counter()
        alg, lcfg, objective = self.alg, self.lcfg, self.objective
        batch = Batch.from_groups(groups, pad_token_id=self.pad_token_id)
        layout = self.layout(batch)
        B, T = batch.input_ids.shape
        rewards, metrics = objective.shaped_rewards(batch)
        trained_rows = torch.nonzero(batch.loss_mask.sum(dim=1) > 0).flatten()

        # 1. start-of-step pass: proximal log-probs, values, reference log-probs
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
        prox_lp: Tensor | None = None
        start_entropy: Tensor | None = None
        old_values: Tensor | None = None
        t_fwd = time.perf_counter()
        no_grad_passes = 0  # counted, so a test can prove a pass was skipped
        if need_prox and not bypass and not current and len(trained_rows):
            no_grad_passes += 1
            self._phase("no-grad pass")
            self.model.eval()
            prox_lp, start_entropy, old_values = whole_rows(
                self.forward,
                self.model,
                batch,
                layout,
                trained_rows,
                self.ranks,
                with_values=self.use_critic,
                with_entropy=not alg.entropy_coef,
            )
        ref_lp: Tensor | None = None
        if self.ref_model is not None and len(trained_rows):
            no_grad_passes += 1
            self._phase("reference pass")
            ref_lp, _, _ = whole_rows(
                self.forward, self.ref_model, batch, layout, trained_rows, self.ranks
            )
        metrics["time/no_grad_pass_s"] = time.perf_counter() - t_fwd
        metrics["learner/no_grad_passes"] = float(no_grad_passes)

        # 2. advantages
        old_lp = prox_lp if (alg.off_policy != "none" and prox_lp is not None) else None
        if old_lp is None or loglinear:
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
        # what each sample trained with, for the trace (the run layer publishes it)
        self.last_credit = step_credit(
            alg.advantage, [t.traj_id for t in batch.trajectories], advantages, loss_mask
        )
        trained_rows = torch.nonzero(loss_mask.sum(dim=1) > 0).flatten()
        used_old_lp = torch.zeros(B, T)

        # 3. PPO epochs x minibatches with gradient accumulation
        self.model.train()
        means = WeightedMeans()
        first_pass_lp = torch.zeros(B, T) if prox_lp is None else None
        grad_norms: list[float] = []
        update_losses: list[Tensor | float] = []  # each update's loss (this rank's share)
        nonfinite = 0
        skipped = 0  # fp16 updates the gradient scaler skipped (a gradient overflowed)
        dev = self.device
        updates = 0  # optimizer updates taken so far in this step
        # (host target [B, T], rows, length, device values): read in one transfer at the end
        pending: list[tuple[Tensor, Tensor, int, Tensor]] = []
        for epoch in range(lcfg.ppo_epochs):
            perm = trained_rows[torch.randperm(len(trained_rows), generator=self.generator)]
            # entropy through the graph only when it is in the loss or not yet measured
            with_entropy = bool(alg.entropy_coef) or (start_entropy is None and epoch == 0)
            for mb_rows in minibatch_rows(
                perm, batch.group_index, lcfg.minibatches, objective.couples_group
            ):
                if len(mb_rows) == 0:
                    continue
                denominator = objective.denominator(loss_mask[mb_rows])
                self.optimizer.zero_grad(set_to_none=True)
                step_loss: Tensor | float = 0.0
                # one autocast region per update: each weight is cast once for all of its
                # micro-batches (Precision.casts_once), ended before the weights change
                with self.precision.casts_once():
                    for (idx, L, P), counts in rank_micro_batches(layout, mb_rows, self.ranks):
                        # host -> device without waiting (pinned); the forward finds the loss
                        # positions in the host-side mask, so nothing here reads the device
                        self._phase("forward")
                        m = to_device(loss_mask[idx, :L], dev)
                        lp, ent, values = self.forward(
                            self.model,
                            to_device(batch.input_ids[idx, :L], dev),
                            loss_mask[idx, :L],
                            with_entropy=with_entropy,
                            with_values=self.use_critic,
                            prefix_len=P,
                            lengths=layout.lengths[idx],
                        )
                        behavior = to_device(batch.behavior_logprobs[idx, :L], dev)
                        if current:  # the weights this one update differentiates
                            old = lp.detach()
                        elif loglinear:  # pi_prox interpolated by version, no forward pass
                            old = loglinear_proximal_logprobs(
                                behavior,
                                lp,
                                to_device(batch.versions[idx, :L], dev),
                                self.version,
                                theta_version=self.version + updates / n_updates,
                            )
                        else:
                            old = to_device(old_lp[idx, :L], dev)
                        if epoch == 0 and counts:  # read to the host at the step's end
                            pending.append((used_old_lp, idx, L, old.detach().float() * m))
                        loss, mb_metrics = objective.loss(
                            lp,
                            ent,
                            values,
                            mask=m,
                            old_logprobs=old,
                            behavior_logprobs=behavior,
                            advantages=to_device(advantages[idx, :L], dev),
                            ref_logprobs=_rows(ref_lp, idx, L, dev),
                            old_values=_rows(old_values, idx, L, dev),
                            returns=_rows(returns, idx, L, dev),
                            denominator=denominator,
                            rows=idx,
                        )
                        self._phase("backward")
                        if not counts:  # a padding micro-batch: FSDP's collectives, no gradient
                            self.scaler.scale(loss * 0.0).backward()
                            continue
                        # a non-finite loss shows as a non-finite gradient norm below, checked
                        # once per update: no host synchronisation per micro-batch
                        self.scaler.scale(loss).backward()  # scaled up under fp16 only
                        step_loss = step_loss + loss.detach()
                        means.add(mb_metrics, float(loss_mask[idx, :L].sum()))
                        if first_pass_lp is not None and epoch == 0:
                            pending.append((first_pass_lp, idx, L, lp.detach()))
                updates += 1
                params = self.trained_parameters()
                scaled = self.scaler.is_enabled() and any(p.grad is not None for p in params)
                if self.ranks.world_size > 1 and self.ranks.parallel == "ddp":
                    self._phase("gradient all-reduce")
                self.strategy.reduce_gradients(params)  # summed over the ranks (DDP)
                self._phase("optimizer")
                if scaled:
                    self.scaler.unscale_(self.optimizer)  # clip the true gradients
                gn = self.strategy.local(torch.nn.utils.clip_grad_norm_(params, lcfg.grad_clip))
                if torch.isfinite(gn):  # one synchronisation per optimizer update
                    if scaled:  # skipped by the scaler when a gradient overflowed
                        self.scaler.step(self.optimizer)
                    else:
                        self.optimizer.step()
                    grad_norms.append(float(gn))
                else:
                    nonfinite += 1
                if scaled:
                    scale = self.scaler.get_scale()
                    self.scaler.update()  # halved after an overflow
                    overflowed = self.scaler.get_scale() < scale
                    skipped += int(overflowed)
                self.optimizer.zero_grad(set_to_none=True)
                update_losses.append(step_loss)
        for (target, idx, L, _), values in zip(
            pending, to_host([p[3] for p in pending]), strict=True
        ):
            target[idx, :L] = values
        with warnings.catch_warnings():
            # a step with nothing to train skips optimizer.step(); the schedule still advances
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
            self.scheduler.step()
        self.model.eval()
        self.version += 1
        self.step_count += 1
        self.last_old_logprobs = used_old_lp

        # 4. metrics (summed over the ranks first)
        if self.ranks.distributed:
            self._phase("metrics all-reduce")
            means.all_reduce(self.ranks, self.device)
            if first_pass_lp is not None:
                self.ranks.sum_(first_pass_lp, self.device)
            self.ranks.sum_(used_old_lp, self.device)
        # adaptive KL: every rank adapts beta from the KL seen on all of them
        objective.end_step(lambda seen: self.ranks.sum_(seen, self.device))
        if update_losses:
            losses = torch.stack([torch.as_tensor(x, device=dev).float() for x in update_losses])
            for total in self.ranks.sum_(losses, self.device):
                means.add({"loss/total": total}, 1.0)
        metrics.update(means.means())
        if start_entropy is not None:
            metrics.update(objective.entropy_metrics(start_entropy, loss_mask))
        learner_lp = prox_lp if prox_lp is not None else first_pass_lp
        metrics.update(
            batch_metrics(
                batch, rewards, advantages, loss_mask, learner_lp, grad_norms, self.version - 1
            )
        )
        metrics["nonfinite_skipped"] = float(nonfinite)
        if self.scaler.is_enabled():
            self.skipped_steps += skipped
            metrics["learner/loss_scale"] = float(self.scaler.get_scale())
            metrics["learner/skipped_steps"] = float(skipped)
        metrics["lr"] = float(self.optimizer.param_groups[0]["lr"])
        metrics["version"] = float(self.version)
        metrics["time/step_s"] = time.perf_counter() - t0
        metrics["tokens_per_s"] = metrics["tokens/total"] / max(metrics["time/step_s"], 1e-9)
        return as_floats(metrics)  # the step's device-side metrics read in one transfer

    # --- weights and checkpoints -----------------------------------------------------

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
        """Model (safetensors), optimizer, scheduler, RNG states, version, step -- atomically.
        Several ranks: rank 0 writes it (DDP), or every rank its shards
        (:mod:`agentrl.learner.sharded_checkpoint`)."""
        if self.ranks.parallel == "fsdp":
            return sharded_checkpoint.save(self, directory)
        if not self.ranks.is_main:  # DDP: the weights and optimizer are rank 0's too
            self.ranks.barrier()
            return Path(directory)
        directory = self._save_whole(directory)
        self.ranks.barrier()
        return directory

    def _save_whole(self, directory: str | Path) -> Path:
        from safetensors.torch import save_model

        directory = Path(directory)
        with atomic_directory(directory) as tmp:
            save_policy(self.model, tmp)  # with LoRA: the adapter, and the merged policy
            if self.use_critic:
                save_model(self._critic_module(), str(tmp / "critic.safetensors"))
            torch.save(
                {
                    "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(),
                    "generator": self.generator.get_state(),
                    "rng": capture_rng_state(),
                    "scaler": self.scaler.state_dict(),  # {} unless fp16
                    "objective": self.objective.state_dict(),  # the adaptive-KL beta
                },
                tmp / "trainer_state.pt",
            )
            meta = {
                "version": self.version,
                "step": self.step_count,
                "advantage": self.alg.advantage,
                "critic": self.use_critic,
            }
            (tmp / "learner.json").write_text(json.dumps(meta))
        return directory

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore what :meth:`save_checkpoint` wrote (also after a kill mid-save)."""
        from safetensors.torch import load_model

        directory = resolve_checkpoint(directory)
        meta = json.loads((directory / "learner.json").read_text())
        if bool(meta.get("critic")) != self.use_critic:
            raise CheckpointError(
                f"checkpoint {directory} was saved with critic={meta.get('critic')} but this "
                f"learner has critic={self.use_critic}; use the config the run was started with"
            )

        state = torch.load(directory / "trainer_state.pt", map_location="cpu", weights_only=False)
        sharded, shards = self.ranks.parallel == "fsdp", sharded_checkpoint.has_shards(directory)
        if sharded and shards:  # resharded to this world size by DCP
            sharded_checkpoint.load_sharded_into_sharded(self, directory)
        elif sharded:
            sharded_checkpoint.load_whole_into_sharded(self, directory, state["optimizer"])
        else:
            load_policy(self.model, directory, self.device)
            if self.use_critic:
                load_model(
                    self._critic_module(),
                    str(directory / "critic.safetensors"),
                    device=str(self.device),
                )
            if shards:  # a sharded learner's checkpoint: the optimizer by parameter name
                sharded_checkpoint.load_optimizer_from_shards(self, directory)
            else:
                self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"])
        if self.scaler.is_enabled() and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        restore_rng_state(state["rng"])
        self.objective.load_state_dict(state.get("objective") or {})
        self.version = int(meta["version"])
        self.step_count = int(meta["step"])

    def wait_ready(self) -> None:
        """Ready when constructed (see :class:`~agentrl.learner.LearnerLike`)."""

    def close(self) -> None:
        """Nothing to release in this process (see :class:`~agentrl.learner.LearnerLike`)."""


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
