"""When the start-of-step pass cannot change the result: the proximal-policy bypass.

Under ``off_policy: tis`` / ``decoupled`` (``proximal: recompute``) the learner recomputes
pi_old with its current weights before the step's updates. When those weights are the
ones that sampled every trained token (a synchronous run: ``max_staleness: 0``, all tokens
at the learner's version), the step makes one optimizer update (``ppo_epochs`` x
``minibatches`` = 1) and the sampler computes in the learner's dtype, pi_old *is* the
behaviour policy up to kernel rounding, so the behaviour log-probs stand in for it and the
pass is skipped (verl's "bypass mode"). The importance weight pi_old / pi_behave is then
exactly 1, which is what it is to rounding when recomputed.

The decision has two halves: :func:`bypass_blockers` (the config, once) and the batch
(every trained token at the learner's version, each step). ``algorithm.proximal_bypass:
off`` keeps the pass always.

When the behaviour policy is *not* pi_old (tokens a version or more old, an asynchronous
run; the sampler in another dtype or another engine) but the step still makes one
optimizer update, pi_old is the policy the update's own forward computes: the weights the
step starts with are the weights that update differentiates. Its log-probs, detached, are
then pi_old exactly (the ratio is 1, its gradient the policy gradient), so the pass is
skipped there too and they stand in for it (:func:`current_blockers` says when not). The
importance weight pi_old / pi_behave keeps correcting the staleness, as with the pass.
"""

from __future__ import annotations

import torch

from agentrl.learner.precision import Precision
from agentrl.learner.settings import LearnerSettings


def _common_blockers(settings: LearnerSettings, pass_needed_for: str) -> list[str]:
    """What keeps the pass under either way of skipping it."""
    alg, lcfg = settings.algorithm, settings.train
    out: list[str] = []
    if alg.proximal_bypass == "off":
        out.append("algorithm.proximal_bypass=off")
    if alg.off_policy == "none":
        out.append("algorithm.off_policy=none (no pass to skip)")
    if alg.off_policy == "decoupled" and alg.proximal == "loglinear":
        out.append("algorithm.proximal=loglinear (no pass to skip)")
    if pass_needed_for:
        out.append(f"the pass is needed for {pass_needed_for}")
    if lcfg.ppo_epochs * lcfg.minibatches != 1:
        out.append(
            f"{lcfg.ppo_epochs * lcfg.minibatches} optimizer updates per step "
            "(learner.ppo_epochs x learner.minibatches)"
        )
    return out


def dropout_in(model: torch.nn.Module) -> str:
    """Where `model` drops activations in train mode ('' when nowhere): then the update's
    forward (train mode) is not the pass's (eval mode)."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Dropout) and module.p > 0:
            return f"{name} (p={module.p})"
    config = getattr(model, "config", None)
    for key in ("attention_dropout", "attn_pdrop", "hidden_dropout", "resid_pdrop"):
        value = getattr(config, key, 0.0)
        if isinstance(value, int | float) and value > 0:
            return f"config.{key}={value}"
    return ""


def current_blockers(
    settings: LearnerSettings, model: torch.nn.Module, *, pass_needed_for: str = ""
) -> list[str]:
    """Why the update's own forward may not stand in for the pass (empty: it does whenever
    the behaviour log-probs may not, see the module doc)."""
    out = _common_blockers(settings, pass_needed_for)
    dropout = dropout_in(model)
    if dropout:
        out.append(f"dropout in train mode: {dropout}")
    return out


def bypass_blockers(
    settings: LearnerSettings, precision: Precision, *, pass_needed_for: str = ""
) -> list[str]:
    """Why the config keeps the start-of-step pass for the proximal log-probs (empty: it
    may be bypassed on batches whose tokens are all at the learner's version).

    `pass_needed_for` names what else needs the pass (critic values, the KL in the reward):
    then it runs anyway and bypassing its log-probs saves nothing."""
    alg = settings.algorithm
    out = _common_blockers(settings, pass_needed_for)
    if settings.max_staleness != 0:
        out.append(f"orchestrator.max_staleness={settings.max_staleness}")
    if alg.is_mask is not None:
        out.append(f"algorithm.is_mask={alg.is_mask} rejects tokens by the recomputed ratio")
    learner_dtype = precision.compute_dtype
    s_dtype = settings.sampler_dtype  # the hf sampler's, resolved with the settings
    if s_dtype is None:
        out.append(f"sampler.backend={settings.sampler_backend} (other kernels than the learner's)")
    elif s_dtype != learner_dtype:
        out.append(f"sampler computes in {s_dtype}, the learner in {learner_dtype}")
    if settings.sampler_precision in ("int8", "fp8"):
        out.append(f"sampler.weight_precision={settings.sampler_precision} (quantized weights)")
    return out
