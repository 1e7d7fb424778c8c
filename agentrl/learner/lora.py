"""LoRA on the policy (``model.lora``): the learner trains the adapters only; samplers, exports
and evaluation see merged weights under the base model's names.

    policy = apply_lora(policy, settings.model.lora)  # the same module, adapters injected (peft)
    state = sampler_state(policy)                   # base + B @ A * alpha / r, base names
    save_policy(policy, folder)                     # adapter.safetensors + merged model.safetensors
    load_policy(policy, folder, device)             # resume: the adapter into the fresh base
    reference = AdaptersOff(policy)                 # the KL reference: no second copy

The learner keeps the transformers model itself (peft injects its layers in place), so the
forward passes, the fused LM head and gradient checkpointing see the same module as
without LoRA, and the optimizer picks up only what requires gradients. A checkpoint holds
the adapter (what resume loads) and the merged policy (what ``agentrl eval`` and
``agentrl export`` read, unchanged from a full fine-tune).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from agentrl.errors import CheckpointError, ConfigError
from agentrl.runfolder import ADAPTER_WEIGHTS, POLICY_WEIGHTS
from agentrl.weights.files import unshared


def _lora_layer_type() -> type | None:
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return None
    return LoraLayer


def apply_lora(model: Any, lora: Any, gradient_checkpointing: bool = False) -> Any:
    """Inject LoRA adapters (``model.lora``: r, alpha, dropout, target_modules) into `model`
    in place and freeze everything else; returns the transformers model itself."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ConfigError(
            "model.lora needs the peft package: pip install 'agentrl[lora]' (or set "
            "model.lora=null for full fine-tuning)"
        ) from None
    targets = lora.target_modules
    peft_cfg = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets if isinstance(targets, str) else list(targets),
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        wrapped = get_peft_model(model, peft_cfg)
    except ValueError as e:
        names = sorted(
            {
                n.rsplit(".", 1)[-1]
                for n, m in model.named_modules()
                if isinstance(m, torch.nn.Linear)
            }
        )
        raise ConfigError(
            f"model.lora.target_modules={targets!r} does not fit this model ({e}); its linear "
            f"layers are named {', '.join(names)}, or use all-linear"
        ) from None
    base = wrapped.get_base_model()
    if isinstance(base.get_output_embeddings(), _lora_layer_type() or ()):
        raise ConfigError(
            f"model.lora.target_modules={targets!r} includes the LM head, which the learner "
            "reads as a plain weight (fused log-probs): leave it out (all-linear does)"
        )
    from peft.tuners.lora import Linear as LoraLinear

    other = sorted(
        n
        for n, m in base.named_modules()
        if isinstance(m, _lora_layer_type() or ()) and not isinstance(m, LoraLinear)
    )
    if other:  # embeddings (tied to the LM head) and convolutions would publish unmerged
        raise ConfigError(
            f"model.lora.target_modules={targets!r} adapts {other[0]}, which is not a linear "
            "layer: only linear layers are supported (all-linear picks them)"
        )
    if gradient_checkpointing:  # frozen embeddings: checkpointed blocks need an input with grad
        base.enable_input_require_grads()
    return base


def has_lora(model: Any) -> bool:
    layer = _lora_layer_type()
    return layer is not None and any(isinstance(m, layer) for m in model.modules())


def _merged_weight(module: Any) -> Tensor:
    weight = module.base_layer.weight
    for adapter in module.active_adapters:
        if adapter in module.lora_A:
            weight = weight + module.get_delta_weight(adapter).to(weight.dtype)
    return weight


@torch.no_grad()
def sampler_state(model: Any) -> dict[str, Tensor]:
    """The policy as a sampler loads it: the plain state dict (views of the live weights),
    or with LoRA each adapted layer's merged weight under its base name."""
    state = model.state_dict()
    layer = _lora_layer_type()
    if layer is None or not has_lora(model):
        return dict(state)
    out = {key.replace(".base_layer.", "."): t for key, t in state.items() if ".lora_" not in key}
    for name, module in model.named_modules():
        if isinstance(module, layer) and hasattr(module, "base_layer"):
            out[f"{name}.weight"] = _merged_weight(module)
    return out


def adapter_state(model: Any) -> dict[str, Tensor]:
    """The adapter's trained tensors under peft's names in `model`."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def save_policy(model: Any, folder: Path) -> None:
    """``model.safetensors`` (the policy under its base names, merged with LoRA) and, with
    LoRA, ``adapter.safetensors`` (what :func:`load_policy` resumes from)."""
    from safetensors.torch import save_file

    if not has_lora(model):
        # tied tensors once, under the first of their names in sorted order, as
        # safetensors' save_model writes them; save_model itself refuses parameters that are
        # views of one flat buffer (a learner process's, agentrl.weights.shared.adopt)
        state = dict(sorted(model.state_dict().items()))
        save_file(unshared(state), str(folder / POLICY_WEIGHTS), {"format": "pt"})
        return
    save_file(unshared(adapter_state(model)), str(folder / ADAPTER_WEIGHTS))
    save_file(unshared(sampler_state(model)), str(folder / POLICY_WEIGHTS))


def _tied_names(state: dict[str, Tensor]) -> list[list[str]]:
    """The names of `state`, grouped by the tensor they are (tied weights: one group)."""
    groups: dict[tuple[int, int, tuple[int, ...]], list[str]] = {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        groups.setdefault(key, []).append(name)
    return list(groups.values())


def load_policy(model: Any, folder: Path, device: torch.device) -> None:
    """Restore what :func:`save_policy` wrote; a checkpoint made with or without LoRA must be
    resumed the same way."""
    from safetensors.torch import load_file

    adapter = folder / ADAPTER_WEIGHTS
    if not has_lora(model):
        if adapter.is_file():
            raise CheckpointError(
                f"checkpoint {folder.parent} holds a LoRA adapter but model.lora is null: "
                "resume with the config the run was started with (its model.lora section)"
            )
        path = folder / POLICY_WEIGHTS
        state = load_file(str(path), device=str(device))
        missing, unexpected = model.load_state_dict(state, strict=False)  # copies in place
        covered = {
            n for names in _tied_names(model.state_dict()) if state.keys() & names for n in names
        }
        missing = sorted(set(missing) - covered)
        if missing or unexpected:
            raise CheckpointError(
                f"{path} does not fit this model (missing {missing[:3]}, unexpected "
                f"{sorted(unexpected)[:3]}): resume with the model the run was started with"
            )
        return
    if not adapter.is_file():
        raise CheckpointError(
            f"checkpoint {folder.parent} holds full weights but model.lora is set: resume "
            "with the config the run was started with (model.lora=null), or start a new run"
        )
    expected = adapter_state(model)
    state = load_file(str(adapter), device=str(device))
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{adapter} does not fit this model's adapter (missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}): were model.lora.r or target_modules changed since the run began?"
        )
    with torch.no_grad():
        for name, t in state.items():
            expected[name].copy_(t)


class AdaptersOff:
    """The policy with its LoRA adapters switched off, which is the initial policy (the
    base weights): the reference model of a LoRA run with a KL term, sharing the policy's
    weights instead of holding a second copy. Calls and ``base_model`` calls run with the
    adapters off; moving, freezing or switching it to eval mode leaves the policy alone."""

    training = False

    def __init__(self, policy: Any) -> None:
        self._policy = policy

    @contextlib.contextmanager
    def _off(self) -> Iterator[None]:
        layers = [m for m in self._policy.modules() if isinstance(m, _lora_layer_type() or ())]
        before = [m._disable_adapters for m in layers]
        for m in layers:
            m._disable_adapters = True
        try:
            yield
        finally:
            for m, was in zip(layers, before, strict=True):
                m._disable_adapters = was

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._off():
            return self._policy(*args, **kwargs)

    @property
    def base_model(self) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            with self._off():
                return self._policy.base_model(*args, **kwargs)

        return run

    def get_output_embeddings(self) -> Any:
        return self._policy.get_output_embeddings()  # never adapted (apply_lora refuses it)

    def modules(self) -> Iterator[Any]:
        return self._policy.modules()

    @property
    def config(self) -> Any:
        return self._policy.config

    def to(self, *args: Any, **kwargs: Any) -> AdaptersOff:
        return self

    def eval(self) -> AdaptersOff:
        return self

    def train(self, mode: bool = True) -> AdaptersOff:
        return self

    def requires_grad_(self, requires_grad: bool = True) -> AdaptersOff:
        return self
