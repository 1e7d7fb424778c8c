"""What the learner's settings decide when a :class:`~agentrl.learner.Learner` is built.

The activation-memory saver on the model (gradient checkpointing or ``recompute_mlp``),
the train settings the step can honour under the ranks and compiled layers, the
distillation teachers, and why the start-of-step pass may not be skipped. The Learner
assembles these with the trainer core (:mod:`agentrl.learner.core`) in its constructor.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from agentrl.learner.distributed import Ranks
from agentrl.learner.precision import Precision, same_attention_kernel
from agentrl.learner.proximal import bypass_blockers, current_blockers
from agentrl.learner.recompute import recompute_mlp
from agentrl.learner.settings import LearnerSettings, TrainSettings
from agentrl.learner.teacher import Teachers

log = logging.getLogger(__name__)


def pad_token_id(tokenizer: Any) -> int:
    """The tokenizer's pad id, else its eos id, else 0 (rows are padded with it)."""
    for attr in ("pad_token_id", "eos_token_id"):
        v = getattr(tokenizer, attr, None)
        if isinstance(v, int):
            return v
    return 0


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


def save_activation_memory(model: Any, settings: LearnerSettings, *, traced: bool) -> None:
    """``model.gradient_checkpointing``, else ``learner.recompute_mlp``, on the policy."""
    if settings.model.gradient_checkpointing:
        enable_checkpointing(model, traced=traced)
    elif settings.train.recompute_mlp:
        patched = recompute_mlp(model)
        log.info("learner.recompute_mlp: %d MLPs keep only their input for backward", patched)
        if not patched:
            log.warning(
                "learner.recompute_mlp: no gated SiLU MLP with plain bias-free linears in "
                "this model (LoRA layers, biases and other MLPs are left as they are)"
            )


def honoured_train_settings(lcfg: TrainSettings, ranks: Ranks, *, traced: bool) -> TrainSettings:
    """`lcfg` with ``share_prompt`` off where the step cannot honour it."""
    if ranks.parallel == "fsdp" and lcfg.share_prompt:
        # the shared-prompt path calls the decoder outside the FSDP root's forward
        lcfg = dataclasses.replace(lcfg, share_prompt=False)
    if traced and lcfg.share_prompt:
        # the shared prompt's KV cache makes every layer its own graph (guards on the
        # layer index and the cache's state), past dynamo's recompile limit
        lcfg = dataclasses.replace(lcfg, share_prompt=False)
        log.info("learner.compile: learner.share_prompt is off with compiled layers")
    return lcfg


def distill_teachers(
    settings: LearnerSettings, tokenizer: Any, device: Any, wrap: Callable[[Any], Any]
) -> Teachers | None:
    """On-policy distillation's teachers that score the sampled tokens (``distill.*``);
    None when distillation is off. `wrap` holds a local teacher as the ranks hold models."""
    if not settings.distill.enabled:
        return None
    if settings.algorithm.dynamic_sampling:
        log.warning(
            "distill with algorithm.dynamic_sampling: groups whose rewards are all "
            "equal are dropped, though the teacher's signal in them is not zero; set "
            "algorithm.dynamic_sampling=false to distil on every group"
        )
    return Teachers(settings.distill, tokenizer, device=device, wrap=wrap)


def pass_blockers(
    settings: LearnerSettings,
    lcfg: TrainSettings,
    precision: Precision,
    model: Any,
    *,
    use_critic: bool,
) -> tuple[list[str], list[str]]:
    """Why the start-of-step pass may not be skipped on batches whose trained tokens are
    all at the learner's version, and why the update's own forward may not give pi_old
    either (then the pass runs); empty lists: it may (:mod:`agentrl.learner.proximal`)."""
    also_needed = [
        what
        for what, on in (
            ("the critic's values", use_critic),
            ("the KL in the reward", settings.algorithm.kl_in_reward),
        )
        if on
    ]
    step_settings = dataclasses.replace(settings, train=lcfg)
    needed_for = " and ".join(also_needed)
    return (
        bypass_blockers(step_settings, precision, pass_needed_for=needed_for),
        current_blockers(step_settings, model, pass_needed_for=needed_for),
    )
