"""The learner: one ``step(groups)`` = advantages, PPO epochs x minibatches, one new version.

    learner = Learner(model, tokenizer, cfg)          # cfg: agentrl.config.Config
    metrics = learner.step(groups)                    # blocking; run it in a worker thread
    weights = learner.state_dict_for_sampler()        # publish as version learner.version

Per step:
1. :meth:`Batch.from_groups`; DAPO overlong shaping of the rewards when on.
2. One no-grad pass at the start (when needed): the proximal log-probs for ``tis`` /
   ``decoupled``, the critic's values for GAE, and the exact sampler-vs-learner gap;
   reference log-probs when a KL term is on.
3. Advantages by name from :mod:`agentrl.algos` (group estimators with the ``valid``
   mask, or GAE with the critic), branch-tree attribution when groups are trees.
4. ``ppo_epochs`` x ``minibatches`` optimizer steps; each minibatch is split into
   length-sorted micro-batches (gradient accumulation, padding trimmed per micro-batch)
   and every micro-batch loss is divided by the whole minibatch's token / sequence count,
   so accumulation equals one big batch.
5. Gradient clipping, AdamW, the lr schedule (stepped once per learner step), version + 1.

Master weights stay float32; bf16 autocast is used where the device computes it natively.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import time
import warnings
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from agentrl.config import AlgorithmConfig, Config, LearnerConfig
from agentrl.errors import CheckpointError, ConfigError
from agentrl.learner.checkpoint import (
    atomic_directory,
    capture_rng_state,
    resolve_checkpoint,
    restore_rng_state,
)
from agentrl.learner.critic import ValueHead, ValueModel, shift_values
from agentrl.learner.forward import shared_prefix_logprobs, token_logprobs
from agentrl.learner.schedule import lr_lambda
from agentrl.types import Batch, TrajectoryGroup

# longest micro-batch (tokens) that the math attention kernel takes on CPU with sdpa_backend auto
MATH_ATTENTION_MAX_TOKENS = 256

_NON_ESTIMATOR_OPTIONS = ("whiten_advantages",)


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        with contextlib.suppress(Exception):
            from agentrl.models import cpu_supports_bf16

            return cpu_supports_bf16()
        with contextlib.suppress(Exception):
            return bool(torch.cpu._is_avx512_bf16_supported())
    return False


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
        self.attribution = cfg.rollout.branching.attribution
        self.device = _resolve_device(self.lcfg.device)
        self.bf16 = self.lcfg.bf16 == "on" or (
            self.lcfg.bf16 == "auto" and _bf16_supported(self.device)
        )
        self._check_algorithm()

        # float32 master weights; bf16 only inside autocast
        self.model = model.to(device=self.device, dtype=torch.float32)
        self.model.config.use_cache = False
        if cfg.model.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.pad_token_id = self._pad_id(tokenizer)

        self.use_critic = self.alg.advantage == "gae"
        self.critic = critic.to(self.device) if critic is not None else None
        self.value_head: ValueHead | None = None
        if self.use_critic and self.critic is None:
            self.value_head = ValueHead(int(self.model.config.hidden_size)).to(self.device)

        self.use_kl = bool(self.alg.kl) and self.alg.kl_coef > 0
        self.ref_model = None
        if self.use_kl:
            ref = ref_model if ref_model is not None else copy.deepcopy(self.model)
            self.ref_model = ref.to(self.device).eval().requires_grad_(False)

        groups = [{"params": [p for p in self.model.parameters() if p.requires_grad]}]
        critic_params = list(self._critic_module().parameters()) if self.use_critic else []
        if critic_params:
            groups.append({"params": critic_params, "lr": self.lcfg.critic_lr or self.lcfg.lr})
        self.optimizer = torch.optim.AdamW(
            groups,
            lr=self.lcfg.lr,
            betas=tuple(self.lcfg.betas),
            weight_decay=self.lcfg.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lr_lambda(self.lcfg.schedule, self.lcfg.warmup_steps, self.total_steps),
        )
        self.generator = torch.Generator().manual_seed(
            cfg.orchestrator.seed if seed is None else seed
        )
        self.version = 0
        self.step_count = 0
        self._prefix: Tensor | None = None  # per-row shared prompt length (see _set_prefixes)
        self._row_group: Tensor | None = None

    # --- setup helpers --------------------------------------------------------------

    def _check_algorithm(self) -> None:
        from agentrl.algos.registry import ADVANTAGES, KL_ESTIMATORS, POLICY_LOSSES

        ADVANTAGES.get(self.alg.advantage)  # unknown names raise with suggestions
        POLICY_LOSSES.get(self.alg.policy_loss)
        if self.alg.kl:
            KL_ESTIMATORS.get(self.alg.kl)
        if self.alg.critic and self.alg.advantage != "gae":
            raise ConfigError(
                f"algorithm.critic is true but algorithm.advantage is "
                f"'{self.alg.advantage}': a critic is only used with algorithm.advantage=gae"
            )
        if self.alg.advantage == "gae" and not self.alg.critic:
            raise ConfigError(
                "algorithm.advantage=gae needs a value function: set algorithm.critic=true"
            )

    @staticmethod
    def _pad_id(tokenizer: Any) -> int:
        for attr in ("pad_token_id", "eos_token_id"):
            v = getattr(tokenizer, attr, None)
            if isinstance(v, int):
                return v
        return 0

    def _critic_module(self) -> torch.nn.Module:
        module = self.critic if self.critic is not None else self.value_head
        assert module is not None
        return module

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def _attention(self, length: int) -> contextlib.AbstractContextManager[Any]:
        """The scaled-dot-product attention kernel for a micro-batch of `length` tokens."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        choice = self.lcfg.sdpa_backend
        if choice == "auto":
            # on CPU the math kernel beat the flash kernel (forward + backward) at up to 256
            # tokens (tiny model, 148 tokens: 0.59 vs 0.68 s a step; SmolLM2, 256: 8.9 vs
            # 9.7 s) and lost at 1024 (SmolLM2: 52 vs 39 s)
            short = self.device.type == "cpu" and length <= MATH_ATTENTION_MAX_TOKENS
            choice = "math" if short else "torch"
        if choice == "torch":
            return contextlib.nullcontext()
        backend = SDPBackend.MATH if choice == "math" else SDPBackend.FLASH_ATTENTION
        return sdpa_kernel(backend)

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
                with self._autocast():
                    lp, ent = chunked_logprobs_entropy(
                        hidden, weight, labels, chunk=chunk, with_entropy=with_entropy, fused=mode
                    )
                (lp.sum() + ent.sum() if with_entropy else lp.sum()).backward()
        return time.perf_counter() - t0

    def _params(self) -> list[Tensor]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    # --- forward passes ---------------------------------------------------------------

    def _micro_batches(self, rows: Tensor, lengths: Tensor) -> Iterator[tuple[Tensor, int, int]]:
        """Micro-batches ``(rows, trimmed length, shared prefix length)``.

        With ``learner.share_prompt`` the rows of one group that share their prompt go
        together, so the prompt is forwarded once per micro-batch (see
        :func:`~agentrl.learner.forward.shared_prefix_logprobs`); other rows are sorted by
        length to minimise padding.
        """
        mbs = self.lcfg.micro_batch_size
        prefix = self._prefix
        buckets: dict[tuple[int, int], list[int]] = {}
        loose: list[int] = []
        for r in rows.tolist():
            key = (int(self._row_group[r]), int(prefix[r])) if prefix is not None else None
            if key is not None and key[1] > 0:
                buckets.setdefault(key, []).append(r)
            else:
                loose.append(r)
        for (_, P), members in buckets.items():
            members.sort(key=lambda r: -int(lengths[r]))
            for i in range(0, len(members), mbs):
                idx = torch.tensor(members[i : i + mbs], dtype=torch.long)
                L = int(lengths[idx].max())
                yield idx, L, (P if len(idx) > 1 and P < L else 0)
        if loose:
            order = torch.tensor(loose, dtype=torch.long)
            order = order[torch.argsort(lengths[order], descending=True, stable=True)]
            for i in range(0, len(order), mbs):
                idx = order[i : i + mbs]
                yield idx, int(lengths[idx].max()), 0

    def _set_prefixes(self, batch: Batch) -> None:
        """Per row, the length of the prompt it shares with the rest of its group (0: none)."""
        B = batch.size
        self._row_group = batch.group_index
        if not self.lcfg.share_prompt or not batch.trajectories:
            self._prefix = None
            return
        prefix = torch.zeros(B, dtype=torch.long)
        first: dict[tuple[int, int], int] = {}
        for r, traj in enumerate(batch.trajectories):
            P = traj.prompt_length
            key = (int(batch.group_index[r]), P)
            if P <= 0:
                continue
            ref = first.setdefault(key, r)
            if ref == r or torch.equal(batch.input_ids[r, :P], batch.input_ids[ref, :P]):
                prefix[r] = P
        self._prefix = prefix

    def _forward(
        self,
        model: Any,
        input_ids: Tensor,
        mask: Tensor,
        *,
        with_entropy: bool,
        with_values: bool,
        prefix_len: int = 0,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """(logprobs, entropy, values) for one micro-batch, all float32 ``[b, L]``.

        ``prefix_len > 0``: the rows share that many leading tokens (forwarded once)."""
        forward = token_logprobs
        if prefix_len > 0:
            forward = functools.partial(shared_prefix_logprobs, prefix_len=prefix_len)
        with self._autocast(), self._attention(input_ids.shape[1]):
            out = forward(
                model,
                input_ids,
                mask,
                temperature=self.temperature,
                chunk=self.lcfg.logprob_chunk,
                with_entropy=with_entropy,
                fused=self.lcfg.fused_logprobs,
                keep_hidden=with_values and self.value_head is not None,
            )
            values = None
            if with_values:
                if self.value_head is not None:
                    assert out.hidden is not None
                    values = shift_values(self.value_head(out.hidden))
                else:
                    assert self.critic is not None
                    values = shift_values(self.critic(input_ids))
        ent = out.entropy.float() if out.entropy is not None else None
        return out.logprobs.float(), ent, values.float() if values is not None else None

    @torch.no_grad()
    def _no_grad_pass(
        self,
        model: Any,
        batch: Batch,
        rows: Tensor,
        lengths: Tensor,
        *,
        with_values: bool = False,
        with_entropy: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """(logprobs, entropy, values) ``[B, T]`` on CPU for `rows`, without gradients."""
        B, T = batch.input_ids.shape
        lp = torch.zeros(B, T)
        ent = torch.zeros(B, T) if with_entropy else None
        values = torch.zeros(B, T) if with_values else None
        for idx, L, P in self._micro_batches(rows, lengths):
            ids = batch.input_ids[idx, :L].to(self.device)
            m = batch.loss_mask[idx, :L].to(self.device)
            lp_mb, ent_mb, v_mb = self._forward(
                model, ids, m, with_entropy=with_entropy, with_values=with_values, prefix_len=P
            )
            lp[idx, :L] = lp_mb.cpu()
            if ent is not None and ent_mb is not None:
                ent[idx, :L] = ent_mb.cpu()
            if values is not None and v_mb is not None:
                values[idx, :L] = v_mb.cpu()
        return lp, ent, values

    @torch.no_grad()
    def compute_logprobs(self, groups_or_batch: Sequence[TrajectoryGroup] | Batch) -> Tensor:
        """Current policy log-probs ``[B, T]`` (aligned with input_ids) on the model tokens."""
        batch = (
            groups_or_batch
            if isinstance(groups_or_batch, Batch)
            else Batch.from_groups(groups_or_batch, pad_token_id=self.pad_token_id)
        )
        self._set_prefixes(batch)
        lengths = batch.attention_mask.sum(dim=1)
        rows = torch.nonzero(batch.loss_mask.sum(dim=1) > 0).flatten()
        self.model.eval()
        lp, _, _ = self._no_grad_pass(self.model, batch, rows, lengths)
        return lp

    # --- advantages -------------------------------------------------------------------

    def _advantages(
        self,
        groups: Sequence[TrajectoryGroup],
        batch: Batch,
        rewards: Tensor,
        values: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """(advantages [B, T], loss_mask [B, T], returns [B, T] or None)."""
        from agentrl.algos import compute_advantages, compute_gae, place_outcome_rewards

        alg = self.alg
        mask = batch.loss_mask
        is_tree = any(g.is_tree for g in groups)
        if alg.advantage == "gae":
            if is_tree:
                raise ConfigError(
                    "algorithm.advantage=gae does not support branch trees "
                    "(rollout.branching.enabled=true): use a group estimator such as grpo"
                )
            assert values is not None
            token_rewards = place_outcome_rewards(rewards, mask)
            adv, returns = compute_gae(token_rewards, values, mask, alg.gamma, alg.lam)
            if alg.options.get("whiten_advantages", True):
                n = mask.sum()
                if n > 1:
                    mean = (adv * mask).sum() / n
                    std = (((adv - mean) ** 2) * mask).sum().div(n - 1).sqrt()
                    adv = (adv - mean) / (std + 1e-6) * mask
            return adv, mask, returns
        kw = {k: v for k, v in alg.options.items() if k not in _NON_ESTIMATOR_OPTIONS}
        adv_seq = compute_advantages(
            alg.advantage, rewards, batch.group_index, valid=batch.valid, **kw
        )
        if is_tree:
            from agentrl.algos import tree_advantages, tree_from_ids

            trajs = batch.trajectories
            parent, branch_pos = tree_from_ids(
                [t.traj_id for t in trajs],
                [t.parent_id for t in trajs],
                [t.branch_position for t in trajs],
            )
            out = tree_advantages(
                self.attribution, adv_seq, parent, branch_pos, mask, batch.input_ids
            )
            return out.advantages, out.loss_mask.to(mask.dtype), None
        return adv_seq[:, None] * mask, mask, None

    # --- the step ---------------------------------------------------------------------

    def step(self, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        """One training step on `groups`; returns flat float metrics. Blocking."""
        if not groups:
            raise ValueError("Learner.step needs at least one TrajectoryGroup (got none)")
        t0 = time.perf_counter()
        alg, lcfg = self.alg, self.lcfg
        batch = Batch.from_groups(groups, pad_token_id=self.pad_token_id)
        self._set_prefixes(batch)
        B, T = batch.input_ids.shape
        lengths = batch.attention_mask.sum(dim=1)
        loss_mask = batch.loss_mask
        rewards = batch.rewards.clone()
        metrics: dict[str, float] = {}
        if alg.overlong.enabled:
            from agentrl.algos import overlong_penalty

            penalty = alg.overlong.coef * overlong_penalty(
                batch.response_lengths, alg.overlong.max_len, alg.overlong.cache_len
            )
            rewards = rewards + penalty * batch.valid
            metrics["overlong_penalty_mean"] = _vmean(penalty, batch.valid)
        trained_rows = torch.nonzero(loss_mask.sum(dim=1) > 0).flatten()

        # 1. start-of-step pass: proximal log-probs, values, reference log-probs
        n_updates = lcfg.ppo_epochs * lcfg.minibatches
        need_prox = alg.off_policy != "none" or n_updates > 1 or self.use_critic
        prox_lp: Tensor | None = None
        start_entropy: Tensor | None = None
        old_values: Tensor | None = None
        t_fwd = time.perf_counter()
        if need_prox and len(trained_rows):
            self.model.eval()
            prox_lp, start_entropy, old_values = self._no_grad_pass(
                self.model,
                batch,
                trained_rows,
                lengths,
                with_values=self.use_critic,
                with_entropy=not alg.entropy_coef,
            )
        ref_lp: Tensor | None = None
        if self.use_kl and len(trained_rows):
            ref_lp, _, _ = self._no_grad_pass(self.ref_model, batch, trained_rows, lengths)
        metrics["time/no_grad_pass_s"] = time.perf_counter() - t_fwd

        # 2. advantages
        advantages, loss_mask, returns = self._advantages(groups, batch, rewards, old_values)
        trained_rows = torch.nonzero(loss_mask.sum(dim=1) > 0).flatten()
        old_lp = prox_lp if (alg.off_policy != "none" and prox_lp is not None) else None
        if old_lp is None:
            old_lp = batch.behavior_logprobs

        # 3. PPO epochs x minibatches with gradient accumulation
        self.model.train()
        sums: dict[str, float] = defaultdict(float)
        weights: dict[str, float] = defaultdict(float)
        first_pass_lp = torch.zeros(B, T) if prox_lp is None else None
        grad_norms: list[float] = []
        nonfinite = 0
        for _epoch in range(lcfg.ppo_epochs):
            perm = trained_rows[torch.randperm(len(trained_rows), generator=self.generator)]
            for mb_rows in torch.tensor_split(perm, lcfg.minibatches):
                if len(mb_rows) == 0:
                    continue
                n_tok = float(loss_mask[mb_rows].sum())
                n_seq = float(len(mb_rows))
                denom = n_tok if alg.agg == "token-mean" else n_seq
                self.optimizer.zero_grad(set_to_none=True)
                step_loss = 0.0
                # entropy through the graph only when it is in the loss or not yet measured
                with_entropy = bool(alg.entropy_coef) or (start_entropy is None and _epoch == 0)
                for idx, L, P in self._micro_batches(mb_rows, lengths):
                    loss, mb_metrics, lp_mb = self._micro_loss(
                        batch, idx, L, P, loss_mask, advantages, old_lp, ref_lp,
                        old_values, returns, denom, with_entropy,
                    )  # fmt: skip
                    if not torch.isfinite(loss):
                        nonfinite += 1
                        continue
                    loss.backward()
                    step_loss += float(loss.detach())
                    w = float(loss_mask[idx, :L].sum())
                    for k, v in mb_metrics.items():
                        sums[k] += v * w
                        weights[k] += w
                    if first_pass_lp is not None and _epoch == 0:
                        first_pass_lp[idx, :L] = lp_mb
                gn = torch.nn.utils.clip_grad_norm_(self._params(), lcfg.grad_clip)
                if torch.isfinite(gn):
                    self.optimizer.step()
                    grad_norms.append(float(gn))
                else:
                    nonfinite += 1
                self.optimizer.zero_grad(set_to_none=True)
                sums["loss/total"] += step_loss
                weights["loss/total"] += 1.0
        with warnings.catch_warnings():
            # a step with nothing to train skips optimizer.step(); the schedule still advances
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
            self.scheduler.step()
        self.model.eval()
        self.version += 1
        self.step_count += 1

        # 4. metrics
        for k, v in sums.items():
            metrics[k] = v / max(weights[k], 1e-12)
        if start_entropy is not None:
            from agentrl.algos.aggregation import aggregate

            metrics["entropy"] = _masked_mean(start_entropy, loss_mask)
            metrics["loss/entropy"] = float(
                aggregate(alg.agg, start_entropy, loss_mask, norm_length=self.norm_length)
            )
        learner_lp = prox_lp if prox_lp is not None else first_pass_lp
        metrics.update(
            self._batch_metrics(batch, rewards, advantages, loss_mask, learner_lp, grad_norms)
        )
        metrics["nonfinite_skipped"] = float(nonfinite)
        metrics["lr"] = float(self.optimizer.param_groups[0]["lr"])
        metrics["version"] = float(self.version)
        metrics["time/step_s"] = time.perf_counter() - t0
        metrics["tokens_per_s"] = metrics["tokens/total"] / max(metrics["time/step_s"], 1e-9)
        return metrics

    def _micro_loss(
        self,
        batch: Batch,
        idx: Tensor,
        L: int,
        P: int,
        loss_mask: Tensor,
        advantages: Tensor,
        old_lp: Tensor,
        ref_lp: Tensor | None,
        old_values: Tensor | None,
        returns: Tensor | None,
        denom: float,
        with_entropy: bool,
    ) -> tuple[Tensor, dict[str, float], Tensor]:
        from agentrl.algos import kl_divergence, policy_loss
        from agentrl.algos.aggregation import aggregate
        from agentrl.algos.policy import value_loss

        alg, dev = self.alg, self.device
        ids = batch.input_ids[idx, :L].to(dev)
        m = loss_mask[idx, :L].to(dev)
        agg_kw = {"norm_length": self.norm_length, "denominator": denom}
        lp, ent, values = self._forward(
            self.model, ids, m, with_entropy=with_entropy, with_values=self.use_critic, prefix_len=P
        )
        pg, pg_metrics = policy_loss(
            alg.policy_loss,
            lp,
            old_lp[idx, :L].to(dev),
            advantages[idx, :L].to(dev),
            m,
            agg=alg.agg,
            behavior_logprobs=batch.behavior_logprobs[idx, :L].to(dev),
            correction=alg.off_policy,
            is_cap=alg.is_cap,
            eps_low=alg.eps_low,
            eps_high=alg.eps_high,
            dual_clip_c=alg.dual_clip_c,
            **agg_kw,
        )
        metrics = {f"pg/{k}": v for k, v in pg_metrics.items() if k != "pg_loss"}
        loss = pg
        metrics["loss/pg"] = _unscaled(pg, m, denom, alg.agg)
        if ent is not None:
            ent_term = aggregate(alg.agg, ent if alg.entropy_coef else ent.detach(), m, **agg_kw)
            metrics["loss/entropy"] = _unscaled(ent_term, m, denom, alg.agg)
            metrics["entropy"] = _masked_mean(ent, m)
            if alg.entropy_coef:
                loss = loss - alg.entropy_coef * ent_term
        if ref_lp is not None:
            kl_tok = kl_divergence(alg.kl, lp, ref_lp[idx, :L].to(dev))  # type: ignore[arg-type]
            kl_term = aggregate(alg.agg, kl_tok, m, **agg_kw)
            loss = loss + alg.kl_coef * kl_term
            metrics["loss/kl"] = _unscaled(kl_term, m, denom, alg.agg)
            metrics["kl"] = _masked_mean(kl_tok, m)
        if values is not None:
            assert old_values is not None and returns is not None
            vl, vl_metrics = value_loss(
                values,
                old_values[idx, :L].to(dev),
                returns[idx, :L].to(dev),
                m,
                clip=alg.value_clip if alg.value_clip > 0 else None,
                agg=alg.agg,
                **agg_kw,
            )
            loss = loss + alg.vf_coef * vl
            metrics["loss/value"] = _unscaled(vl, m, denom, alg.agg)
            metrics.update({f"value/{k}": v for k, v in vl_metrics.items() if k != "vf_loss"})
        return loss, metrics, lp.detach().cpu()

    def _batch_metrics(
        self,
        batch: Batch,
        rewards: Tensor,
        advantages: Tensor,
        loss_mask: Tensor,
        learner_lp: Tensor | None,
        grad_norms: list[float],
    ) -> dict[str, float]:
        valid = batch.valid
        m = loss_mask > 0
        out: dict[str, float] = {
            "reward/mean": _vmean(batch.rewards, valid),
            "reward/shaped_mean": _vmean(rewards, valid),
            "samples": float(batch.size),
            "samples/valid": float(valid.sum()),
            "samples/infra_masked": float((valid == 0).sum()),
            "tokens/trained": float(m.sum()),
            "tokens/total": float(batch.attention_mask.sum()),
            "response_length/mean": _vmean(batch.response_lengths.float(), valid),
            "response_length/max": float(batch.response_lengths.max()),
            "grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else 0.0,
            "grad_norm/max": max(grad_norms) if grad_norms else 0.0,
            "optimizer_steps": float(len(grad_norms)),
        }
        sel = advantages[m]
        if sel.numel():
            out.update(
                {
                    "advantage/mean": float(sel.mean()),
                    "advantage/std": float(sel.std()) if sel.numel() > 1 else 0.0,
                    "advantage/min": float(sel.min()),
                    "advantage/max": float(sel.max()),
                }
            )
        # staleness of trained tokens w.r.t. the weights that trained on them
        staleness = (self.version - 1) - batch.versions
        st = staleness[m]
        if st.numel():
            out["staleness/mean"] = float(st.float().mean())
            out["staleness/max"] = float(st.max())
            for s, c in zip(*torch.unique(st, return_counts=True), strict=True):
                out[f"staleness/tokens_{int(s)}"] = float(c)
        if learner_lp is not None and st.numel():
            gap = (batch.behavior_logprobs - learner_lp).abs()[m]
            out["logprob_gap/mean"] = float(gap.mean())
            out["logprob_gap/max"] = float(gap.max())
            # importance ratio pi_learner / pi_behavior at the start of the step
            ratio = torch.exp((learner_lp - batch.behavior_logprobs)[m].clamp(-20, 20))
            out["is_ratio/mean"] = float(ratio.mean())
            out["is_ratio/max"] = float(ratio.max())
            out["is_ratio/min"] = float(ratio.min())
            for s in torch.unique(st):
                out[f"logprob_gap/staleness_{int(s)}"] = float(gap[st == s].mean())
        return out

    # --- weights and checkpoints -----------------------------------------------------

    def state_dict_for_sampler(self, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
        """A CPU copy of the policy weights (optionally cast), safe to hand to another thread."""
        out: dict[str, Tensor] = {}
        for k, v in self.model.state_dict().items():
            t = v.detach().to("cpu", dtype=dtype or v.dtype, copy=True)
            out[k] = t
        return out

    def save_checkpoint(self, directory: str | Path) -> Path:
        """Model (safetensors), optimizer, scheduler, RNG states, version, step -- atomically."""
        from safetensors.torch import save_model

        directory = Path(directory)
        with atomic_directory(directory) as tmp:
            save_model(self.model, str(tmp / "model.safetensors"))
            if self.use_critic:
                save_model(self._critic_module(), str(tmp / "critic.safetensors"))
            torch.save(
                {
                    "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(),
                    "generator": self.generator.get_state(),
                    "rng": capture_rng_state(),
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
        load_model(self.model, str(directory / "model.safetensors"), device=str(self.device))
        if self.use_critic:
            load_model(
                self._critic_module(),
                str(directory / "critic.safetensors"),
                device=str(self.device),
            )
        state = torch.load(directory / "trainer_state.pt", map_location="cpu", weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"])
        restore_rng_state(state["rng"])
        self.version = int(meta["version"])
        self.step_count = int(meta["step"])


def _vmean(x: Tensor, valid: Tensor) -> float:
    n = valid.sum()
    return float((x.float() * valid).sum() / n) if n > 0 else 0.0


def _masked_mean(x: Tensor, mask: Tensor) -> float:
    n = mask.sum()
    return float((x.detach().float() * mask).sum() / n) if n > 0 else 0.0


def _unscaled(term: Tensor, mask: Tensor, denom: float, agg: str) -> float:
    """A micro-batch term divided by the minibatch count -> its own local mean."""
    local = float(mask.sum()) if agg == "token-mean" else float((mask.sum(dim=1) > 0).sum())
    return float(term.detach()) * denom / max(local, 1e-12)
