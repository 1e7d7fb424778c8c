"""Regional compilation of the learner's decoder layers (``learner.compile``).

Each decoder layer of the policy (and of a separate critic's backbone and of the KL
reference model, which the learner forwards too) is compiled in place with
``torch.compile`` (``module.compile()``): the layer's RMSNorms, rotary embedding, SiLU
gate and residual adds, each a few small element-wise kernels in transformers' eager
code, fuse into a handful of kernels around the matmuls. In place means the module tree,
parameter names and ``state_dict`` keys are unchanged (no ``_orig_mod.`` prefix), so
checkpoints, resume, LoRA's merge and the weights published to samplers see the same
model as without it.

- ``off`` (the default): eager. The default stays off until a GPU run has measured the
  compiled layers (none has yet: docs/gpu.md); ``auto`` is the intended default after that.
- ``auto``: on when the learner is on CUDA; off on CPU, where the first compile takes
  tens of seconds of a few cores (the 2-layer test model's graphs over a minute) and pays
  back only over long runs (SmolLM2-135M on 2 cores: 1.16-1.21x a step after ~29 s,
  ``benchmarks/learner_compile.py``). A forward whose compile fails puts the layers back
  to eager with one warning (this path has not yet run on a GPU).
- ``on``: compiled on any device (inductor's C++ backend on CPU); a model whose decoder
  layers cannot be found is a config error.

Layers are found generically (:func:`decoder_blocks`): the module classes a transformers
model names in ``_no_split_modules`` (its repeated blocks), else a ``layers`` ModuleList.
Shapes: ``dynamic=True``: the batch and sequence dimensions are symbolic from the first
compile, so micro-batches of any padded or packed length reuse one graph per variant
(training / no-grad, one row / several). ``dynamic=None`` (static first, dynamic on the
first change) recompiled on every new length once the no-grad pass and the training
forward alternated, up to dynamo's recompile limit, after which a layer silently runs
eagerly; ``tests/learner/test_compile.py`` counts the graphs. For the same reason the
learner turns ``learner.share_prompt`` off with compiled layers: the shared prompt's KV
cache makes every layer its own graph (guards on its layer index and the cache's state).

The first step pays the compile (seconds per distinct layer graph; all layers of one
model share a graph). Composes with bf16/fp16 autocast (autocast is traced into the
graph: the weights' casts happen inside the compiled layer, once per micro-batch, instead
of once per update as :meth:`Precision.casts_once` does eagerly; counted in
docs/performance.md), gradient checkpointing (traced into the graph when transformers
checkpoints inside the layer's forward, as 5.2x does; the attention-kernel ``context_fn``
is left out then), LoRA (peft's adapted linears are traced inside the layer) and DDP;
FSDP2 (``learner.parallel: fsdp``) is refused with ``on`` and skipped with ``auto``:
dynamo breaks the layer's graph at its hooks, and it has not been measured across GPUs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

import torch

from agentrl.errors import ConfigError

log = logging.getLogger(__name__)

Compile = Literal["auto", "on", "off"]

# torch.compile's backend. Not a config key: tests pass "aot_eager" to the learner (it traces
# and runs the same graphs without inductor's code generation, minutes of a 2-core CPU)
DEFAULT_BACKEND = "inductor"
Backend = str | Callable[..., Any]  # a torch.compile backend: a name or a callable


def wanted(mode: str, device: torch.device) -> bool:
    """Whether ``learner.compile=mode`` compiles on `device`."""
    if mode == "on":
        return True
    return mode == "auto" and device.type == "cuda"


def _block_class_names(model: torch.nn.Module) -> set[str]:
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return names


def decoder_blocks(model: Any) -> list[torch.nn.Module]:
    """The repeated decoder blocks of a transformers model (also under a peft wrapper or
    in a critic's backbone): modules of the classes in ``_no_split_modules`` (outermost
    ones only), else the first non-empty ``layers`` ModuleList; [] when neither exists."""
    classes = _block_class_names(model)
    blocks: list[torch.nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside:
            continue
        if type(module).__name__ in classes:
            blocks.append(module)
            inside.update(id(m) for m in module.modules())
    if blocks:
        return blocks
    for name, module in model.named_modules():
        last = name.split(".")[-1]
        if last == "layers" and isinstance(module, torch.nn.ModuleList) and len(module):
            return list(module)
    return []


def compile_layers(
    model: Any,
    mode: str,
    device: torch.device,
    *,
    what: str,
    backend: Backend = DEFAULT_BACKEND,
) -> int:
    """Compile `model`'s decoder blocks in place with torch.compile's `backend` when
    ``learner.compile=mode`` asks for it on `device`; returns how many were compiled (0 when
    off, or skipped under ``auto``). `what` names the model in errors and logs ("the policy")."""
    if not wanted(mode, device):
        return 0
    blocks = decoder_blocks(model)
    if not blocks:
        why = (
            f"learner.compile={mode}: found no decoder layers in {what} "
            f"({type(model).__name__}: no `_no_split_modules` classes, no `layers` ModuleList)"
        )
        if mode == "on":
            raise ConfigError(f"{why}; set learner.compile=off for this model")
        log.info("%s; %s stays eager", why, what)
        return 0
    for block in blocks:
        # in place: the module keeps its names and state_dict keys; a block copied from a
        # compiled one (deepcopy) would still call the original's compiled forward
        block.compile(backend=backend, dynamic=True)
        if mode == "auto":
            block._compiled_call_impl = _eager_on_failure(block, blocks, what)
    return len(blocks)


def _eager_on_failure(
    block: torch.nn.Module, blocks: list[torch.nn.Module], what: str
) -> Callable[..., Any]:
    """``auto``: the compiled forward of `block`, which, if compiling or running it fails,
    puts every block of `blocks` back to eager (one warning) and runs this call eagerly.
    A failure of the backward's compile (inductor compiles it at the first backward) is
    not caught: it raises."""
    compiled_call = block._compiled_call_impl

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return compiled_call(*args, **kwargs)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:
            if block._compiled_call_impl is not call:  # another thread reverted it already
                raise
            for b in blocks:
                b._compiled_call_impl = None
            cause = getattr(e, "inner_exception", None) or e  # the backend's own error
            log.warning(
                "learner.compile=auto: compiling the decoder layers of %s failed (%s); they run "
                "eagerly (learner.compile=off silences this, learner.compile=on raises)",
                what,
                f"{type(cause).__name__}: {cause}".splitlines()[0][:300],
            )
            return block._call_impl(*args, **kwargs)

    return call


def refusal(mode: str, parallel: str) -> str | None:
    """Why ``learner.compile=mode`` is not applied under ``learner.parallel=parallel``
    (a message naming the fix), or None when it composes."""
    if parallel == "fsdp" and mode != "off":
        return (
            f"learner.compile={mode} with learner.parallel=fsdp: compiled layers under FSDP2's "
            "per-layer hooks have not been run in this project; set learner.compile=off, or "
            "learner.parallel=ddp"
        )
    return None
