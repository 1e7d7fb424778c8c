"""The preference step: one padded forward of chosen and rejected rows, a registered loss,
an AdamW step; held-out preference accuracy; the reference log-probs computed once.

Log-probs come from the learner's path (:func:`agentrl.learner.forward.token_logprobs`):
the decoder once, the LM head chunked and only at the trained positions. A sequence's
log-prob is the sum over its loss mask (the assistant turns after the prompt, or the
tokens after a fork for step pairs).

A loss registered ``token_kl=True`` (TDPO) also needs the reference's whole next-token
distribution at every trained position, which no per-sequence cache holds: the trainer
then keeps a frozen copy of the reference model (the weights it started from; an online
round's starting weights after :meth:`PreferenceTrainer.refresh_reference`) and forwards
it, without gradients, next to the policy at every step.

The model, AdamW, precision, LoRA, the ranks (DDP / FSDP2) and compiled layers are the
trainer core's (:mod:`agentrl.learner.core`, configured by ``learner.*``); a step is one
core update whose micro-batches are this rank's share of the batch's examples (about
``learner.micro_batch_size`` sequences each), every micro-batch loss weighted by its share
of the batch, so the ranks' summed gradients are the one-process gradient.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from agentrl.errors import ConfigError
from agentrl.learner import compiled
from agentrl.learner.core import CoreSettings, TrainerCore
from agentrl.learner.distributed import Ranks
from agentrl.learner.forward import (
    decoder_hidden,
    lm_head_weight,
    selected_positions,
    token_logprobs,
)
from agentrl.learner.lora import sampler_state
from agentrl.learner.precision import Precision
from agentrl.preference.data import Completion, PreferencePair, UnpairedExample
from agentrl.preference.losses import (
    PREFERENCE_LOSSES,
    PairLogps,
    PreferenceLoss,
    UnpairedLogps,
    check_options,
    preference_loss,
)
from agentrl.preference.settings import PreferenceSettings

Example = PreferencePair | UnpairedExample


def loss_options(settings: PreferenceSettings) -> dict[str, Any]:
    """``preference.beta`` and ``preference.options`` as the loss's keyword options."""
    options = dict(settings.options)
    if settings.beta is not None:
        options["beta"] = settings.beta
    check_options(settings.loss, options)
    return options


def sequences_of(examples: Sequence[Example]) -> tuple[list[Completion], list[Completion]]:
    """(rows trained with gradients, rows only scored): chosen then rejected for pairs;
    completions, and the KL rows, for unpaired examples."""
    if examples and isinstance(examples[0], UnpairedExample):
        return [e.completion for e in examples], [e.kl for e in examples]  # type: ignore[union-attr]
    return [e.chosen for e in examples] + [e.rejected for e in examples], []  # type: ignore[union-attr]


@dataclass
class StepResult:
    out: PreferenceLoss
    metrics: dict[str, float]


class PreferenceTrainer:
    """A policy, its optimizer and one preference loss (``preference.*``)."""

    def __init__(
        self,
        model: Any,
        settings: PreferenceSettings,
        device: torch.device | None = None,
        pad_id: int = 0,
        *,
        total_steps: int = 1,
        compile_backend: compiled.Backend = compiled.DEFAULT_BACKEND,
    ) -> None:
        lc = settings.train
        self.settings = settings
        self.pad_id = pad_id
        self.loss_name = settings.loss
        PREFERENCE_LOSSES.get(self.loss_name)  # an unknown name fails here, listing the known
        self.options = loss_options(settings)
        self.unpaired = PREFERENCE_LOSSES.unpaired(self.loss_name)
        self.needs_reference = PREFERENCE_LOSSES.needs_reference(self.loss_name)
        self.token_kl = PREFERENCE_LOSSES.token_kl(self.loss_name)
        ranks = Ranks.from_settings(lc)
        if ranks.distributed and (self.unpaired or self.token_kl):
            raise ConfigError(
                f"preference.loss={self.loss_name} on several ranks (learner.world_size / "
                "learner.parallel=fsdp): its batch statistic (KTO's z_0) or frozen reference "
                "copy (TDPO) is per process; use learner.world_size=1 with learner.parallel=ddp"
            )
        precision = Precision.from_settings(lc)
        if device is not None and torch.device(device) != precision.device:
            precision = dataclasses.replace(precision, device=torch.device(device))
        # LoRA: adapters injected in place and everything else frozen; the reference
        # log-probs, computed before any step, are the base model's (LoRA's B starts at 0)
        self.core = TrainerCore(
            model,
            CoreSettings.of(lc, total_steps=total_steps),
            precision=precision,
            ranks=ranks,
            lora=settings.model.lora,
        )
        self.model = self.core.model
        self.device = self.core.device
        self.optimizer = self.core.optimizer
        self.reference_model: Any = None
        if self.token_kl:
            self.refresh_reference()
        # after the reference's copy: a copy of a compiled layer would run the original
        self.core.compile_layers(
            {"policy": self.model, "reference model": self.reference_model},
            backend=compile_backend,
        )
        # examples per micro-batch: about learner.micro_batch_size sequences (a pair is two);
        # KTO's z_0 is a statistic of the whole batch: one micro-batch
        self.micro_examples = max(1, lc.micro_batch_size // (1 if self.unpaired else 2))
        if self.unpaired:
            self.micro_examples = 1 << 30

    def plain_model(self, fresh: Callable[[], Any]) -> Any:
        """The policy as a plain transformers model (:meth:`TrainerCore.plain_model
        <agentrl.learner.core.TrainerCore.plain_model>`; rank 0's, None on the others)."""
        return self.core.plain_model(fresh)

    def publishable(self) -> dict[str, Tensor]:
        """The weights a sampler loads (LoRA merged under the base names)."""
        return sampler_state(self.model)

    def refresh_reference(self) -> None:
        """Make the current weights the frozen reference of the token-level KL (a copy)."""
        if self.reference_model is None:
            self.reference_model = copy.deepcopy(self.model)
            self.reference_model.requires_grad_(False)
        else:
            self.reference_model.load_state_dict(self.model.state_dict())
        self.reference_model.eval()

    # --- log-probs ---------------------------------------------------------------------

    def _padded(self, seqs: Sequence[Completion]) -> tuple[Tensor, Tensor]:
        """(ids [n, T], loss mask [n, T]), right-padded, on the device; mask[:, 0] = 0."""
        width = max(len(s.input_ids) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width))
        for row, s in enumerate(seqs):
            ids[row, : len(s.input_ids)] = torch.tensor(s.input_ids)
            mask[row, : len(s.loss_mask)] = torch.tensor(s.loss_mask, dtype=torch.float32)
        mask[:, 0] = 0  # the first token is predicted from nothing
        return ids.to(self.device), mask.to(self.device)

    def sequence_logps(self, seqs: Sequence[Completion]) -> tuple[Tensor, Tensor]:
        """(summed log-probs [n] over each loss mask, trained tokens [n]); with gradients
        when grad mode is on. Rows are right-padded (causal attention never sees the pad)."""
        ids, mask = self._padded(seqs)
        lp = token_logprobs(
            self.model,
            ids,
            mask,
            chunk=self.settings.train.logprob_chunk,
            fused=self.settings.train.fused_logprobs,
        ).logprobs
        return (lp * mask).sum(-1), mask.sum(-1)

    def sequence_logps_kl(self, seqs: Sequence[Completion]) -> tuple[Tensor, Tensor, Tensor]:
        """(summed log-probs [n], trained tokens [n], sequential KL [n]):
        ``D_SeqKL(x, y; pi_ref || pi) = sum_t KL(pi_ref(.|x, y_<t) || pi(.|x, y_<t))`` over
        each loss mask. One decoder pass of the policy (with gradients when grad mode is on)
        and one of the frozen reference (without); both LM heads run only at the trained
        positions, ``learner.logprob_chunk`` rows at a time."""
        if self.reference_model is None:
            raise ValueError(f"preference loss {self.loss_name!r} keeps no reference model")
        ids, mask = self._padded(seqs)
        n, width = ids.shape
        hidden = decoder_hidden(self.model, ids)[:, :-1]  # position j predicts token j + 1
        with torch.no_grad():
            ref_hidden = decoder_hidden(self.reference_model, ids)[:, :-1]
        at = selected_positions(mask[:, 1:], self.device)
        size = hidden.shape[-1]
        h = hidden.reshape(-1, size).index_select(0, at)
        h_ref = ref_hidden.reshape(-1, size).index_select(0, at)
        targets = ids[:, 1:].reshape(-1).index_select(0, at)
        rows = torch.div(at, width - 1, rounding_mode="floor")
        head, ref_head = lm_head_weight(self.model), lm_head_weight(self.reference_model)
        chunk = self.settings.train.logprob_chunk
        lps, kls = [], []
        for i in range(0, len(at), chunk):
            logp = torch.log_softmax((h[i : i + chunk] @ head.t()).float(), -1)
            with torch.no_grad():
                logq = torch.log_softmax((h_ref[i : i + chunk] @ ref_head.t()).float(), -1)
            kls.append((logq.exp() * (logq - logp)).sum(-1))
            lps.append(logp.gather(-1, targets[i : i + chunk, None]).squeeze(-1))
        zeros = torch.zeros(n, device=self.device)
        if not lps:
            return zeros, mask.sum(-1), zeros
        logps = zeros.index_add(0, rows, torch.cat(lps))
        seq_kl = zeros.index_add(0, rows, torch.cat(kls))
        return logps, mask.sum(-1), seq_kl

    @torch.no_grad()
    def reference_logps(self, examples: Sequence[Example], batch_size: int) -> Tensor:
        """``[N, 2]`` log-probs of every example under the current weights (the reference):
        chosen and rejected, or completion and KL row."""
        self.model.eval()
        out = []
        for i in range(0, len(examples), batch_size):
            batch = examples[i : i + batch_size]
            train_rows, kl_rows = sequences_of(batch)
            logps, _ = self.sequence_logps(train_rows + kl_rows)
            out.append(logps.view(2, len(batch)).t().cpu())
        return torch.cat(out) if out else torch.zeros(0, 2)

    def logps(self, batch: Sequence[Example], ref: Tensor | None) -> PairLogps | UnpairedLogps:
        train_rows, kl_rows = sequences_of(batch)
        seq_kl = None
        if self.token_kl:
            logps, lengths, seq_kl = self.sequence_logps_kl(train_rows)
        else:
            logps, lengths = self.sequence_logps(train_rows)
        n = len(batch)
        ref = ref.to(self.device) if ref is not None else None
        if self.unpaired:
            if ref is None:
                raise ValueError("KTO needs reference log-probs")
            with torch.no_grad():  # z_0 is not back-propagated
                kl_logp, _ = self.sequence_logps(kl_rows)
            desirable = torch.tensor([e.desirable for e in batch], device=self.device)  # type: ignore[union-attr]
            return UnpairedLogps(logps, lengths, desirable, ref[:, 0], kl_logp, ref[:, 1])
        return PairLogps(
            logps[:n],
            logps[n:],
            lengths[:n],
            lengths[n:],
            ref[:, 0] if ref is not None else None,
            ref[:, 1] if ref is not None else None,
            seq_kl[:n] if seq_kl is not None else None,
            seq_kl[n:] if seq_kl is not None else None,
        )

    # --- steps -------------------------------------------------------------------------

    def loss(self, batch: Sequence[Example], ref: Tensor | None) -> tuple[PreferenceLoss, Any]:
        if self.needs_reference and ref is None:
            raise ValueError(f"preference loss {self.loss_name!r} needs reference log-probs")
        logps = self.logps(batch, ref if self.needs_reference else None)
        return preference_loss(self.loss_name, logps, **self.options), logps

    def micro_batches(self, n: int) -> list[tuple[list[int], bool]]:
        """This rank's micro-batches of a batch of `n` examples, as (indices, counts):
        the ranks take every world-size-th example; lockstep (FSDP) ranks pad with a
        micro-batch whose loss counts 0 up to the most any rank runs."""
        ranks, size = self.core.ranks, self.micro_examples

        def cut(share: list[int]) -> list[list[int]]:
            return [share[i : i + size] for i in range(0, len(share), size)]

        shares = [cut(list(range(r, n, ranks.world_size))) for r in range(ranks.world_size)]
        mine = [(idx, True) for idx in shares[ranks.rank]]
        if ranks.lockstep:
            mine += [([0], False)] * (max(len(s) for s in shares) - len(mine))
        return mine

    def step(self, batch: Sequence[Example], ref: Tensor | None) -> dict[str, float]:
        """One optimizer update on `batch` (every rank passes the same batch)."""
        t0 = time.perf_counter()
        n = len(batch)
        self.model.train()
        sums: dict[str, float] = {}

        def loss_of(idx: list[int], counts: bool) -> Tensor:
            part = ref[idx] if ref is not None else None
            with self.core.precision.autocast():
                out, logps = self.loss([batch[i] for i in idx], part)
            if counts:  # metrics weighted by the micro-batch's share of the batch
                found = {
                    "loss": float(out.loss.detach()),
                    **summarize(out, logps, self.unpaired),
                    **out.metrics,
                }
                for k, v in found.items():
                    sums[k] = sums.get(k, 0.0) + float(v) * len(idx)
            return out.loss * (len(idx) / n)

        done = self.core.update(self.micro_batches(n), loss_of)
        self.core.end_step()
        self.model.eval()
        metrics = self._summed(sums, n)
        metrics["grad_norm"] = done.grad_norm if done.grad_norm is not None else float("nan")
        metrics["examples_per_s"] = n / (time.perf_counter() - t0)
        return metrics

    def _summed(self, sums: dict[str, float], n: int) -> dict[str, float]:
        """Per-example means over every rank's share (one all-reduce)."""
        ranks = self.core.ranks
        keys = ranks.union(sums)
        if ranks.world_size == 1:
            return {k: sums[k] / n for k in keys}
        values = torch.tensor([sums.get(k, 0.0) for k in keys], dtype=torch.float64)
        ranks.sum_(values, self.device)
        return {k: float(v) / n for k, v in zip(keys, values.tolist(), strict=True)}

    @torch.no_grad()
    def evaluate(
        self, examples: Sequence[Example], ref: Tensor | None, batch_size: int
    ) -> dict[str, float]:
        """Held-out loss, preference accuracy and reward margin (means over `examples`)."""
        if not examples:
            return {}
        self.model.eval()
        totals: dict[str, float] = {}
        for i in range(0, len(examples), batch_size):
            batch = examples[i : i + batch_size]
            part = ref[i : i + batch_size] if ref is not None else None
            out, logps = self.loss(batch, part)
            found = {"loss": float(out.loss), **summarize(out, logps, self.unpaired)}
            for k, v in found.items():
                totals[k] = totals.get(k, 0.0) + v * len(batch)
        return {k: v / len(examples) for k, v in totals.items()}


def summarize(out: PreferenceLoss, logps: Any, unpaired: bool) -> dict[str, float]:
    """Rewards, margins and accuracy of one batch (means)."""
    if unpaired:
        r, desirable = out.chosen_rewards, logps.desirable.bool()
        right = torch.where(desirable, r > 0, r < 0).float()
        metrics = {"accuracy": float(right.mean()), "logps": float(logps.logp.detach().mean())}
        if desirable.any():
            metrics["rewards/desirable"] = float(r[desirable].mean())
        if (~desirable).any():
            metrics["rewards/undesirable"] = float(r[~desirable].mean())
        return metrics
    r_w, r_l = out.chosen_rewards, out.rejected_rewards
    return {
        "accuracy": float((r_w > r_l).float().mean()),
        "rewards/chosen": float(r_w.mean()),
        "rewards/rejected": float(r_l.mean()),
        "rewards/margin": float((r_w - r_l).mean()),
        "logps/chosen": float(logps.logp_w.detach().mean()),
        "logps/rejected": float(logps.logp_l.detach().mean()),
    }
