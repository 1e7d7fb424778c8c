"""Recompute the gated MLP's inner activations in backward (``learner.recompute_mlp``).

A Llama-family decoder layer keeps, per token, four ``intermediate``-wide tensors for its
MLP's backward (the gate and up projections, the SiLU of the gate, their product) against
about two ``hidden``-wide ones plus the attention's for the rest of the layer: with
SmolLM2-135M (576 / 1536) the MLP holds over half of what a layer keeps. :class:`GatedMLP`
keeps only the MLP's input and recomputes the gate and up projections in backward: two
of the layer's seven matmuls run again (+13% of the learner's matmul work for SmolLM2,
where full activation checkpointing runs the whole forward again, +33%, and drops the
whole layer's activations). The values and gradients are those of the plain module, up
to float rounding (``tests/learner/test_recompute.py``).

It applies to MLPs whose forward is exactly ``down(act(gate(x)) * up(x))`` with SiLU and
bias-free ``nn.Linear`` projections (Llama, Mistral, Qwen2, SmolLM); anything else (LoRA
layers, biases, other activations, a model on a GPU: the backward follows CPU autocast
only, and this has not been run on one) is left as it is. Under whole-layer activation
checkpointing (``model.gradient_checkpointing``) it adds nothing and is not applied.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F


class GatedMLP(torch.autograd.Function):
    """``down(silu(x @ Wg^T) * (x @ Wu^T))`` keeping only `x` (and the weights) for
    backward. Under autocast the backward recomputes with the forward's autocast state."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx: Any, x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor) -> Tensor:
        ctx.save_for_backward(x, w_gate, w_up, w_down)
        return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, w_gate, w_up, w_down = ctx.saved_tensors
        with torch.no_grad():
            gate, up = F.linear(x, w_gate), F.linear(x, w_up)
            sig = torch.sigmoid(gate)
            act = gate * sig  # silu(gate)
            prod = act * up
            grad = grad.to(prod.dtype)
            g2 = grad.reshape(-1, grad.shape[-1])
            d_down = g2.t().mm(prod.reshape(-1, prod.shape[-1]))
            d_prod = grad.matmul(w_down.to(grad.dtype))
            d_up = d_prod * act
            d_gate = d_prod * up * (sig * (1 + gate * (1 - sig)))  # silu'(gate)
            x2 = x.reshape(-1, x.shape[-1]).to(d_gate.dtype)
            d_w_gate = d_gate.reshape(-1, d_gate.shape[-1]).t().mm(x2)
            d_w_up = d_up.reshape(-1, d_up.shape[-1]).t().mm(x2)
            d_x = d_gate.matmul(w_gate.to(d_gate.dtype)) + d_up.matmul(w_up.to(d_up.dtype))
        return (
            d_x.to(x.dtype),
            d_w_gate.to(w_gate.dtype),
            d_w_up.to(w_up.dtype),
            d_down.to(w_down.dtype),
        )


def _applies(mlp: torch.nn.Module) -> bool:
    projections = [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    if not all(type(p) is torch.nn.Linear and p.bias is None for p in projections):
        return False  # LoRA-wrapped, biased, or another layout
    if mlp.gate_proj.weight.device.type != "cpu":
        return False  # the recompute follows CPU autocast only (GatedMLP's custom_bwd)
    # torch's SiLU, or transformers' SiLUActivation (ACT2FN["silu"])
    if type(getattr(mlp, "act_fn", None)).__name__ not in ("SiLU", "SiLUActivation"):
        return False
    # exactly the Llama forward (a subclass that changes it is left alone)
    return LLAMA_MLP in _source(type(mlp).forward)


LLAMA_MLP = "self.down_proj(self.act_fn(self.gate_proj(x))*self.up_proj(x))"


def _source(fn: Any) -> str:
    """`fn`'s source without whitespace ("" when it cannot be read)."""
    import inspect

    try:
        return "".join(inspect.getsource(fn).split())
    except (OSError, TypeError):
        return ""


def _forward(self: torch.nn.Module, x: Tensor) -> Tensor:
    if not torch.is_grad_enabled():
        return type(self).forward(self, x)  # no backward: nothing to save
    return GatedMLP.apply(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight)


def recompute_mlp(model: torch.nn.Module) -> int:
    """Patch every gated MLP of `model` (see the module docstring); returns how many."""
    count = 0
    for module in model.modules():
        if _applies(module):
            module.forward = types.MethodType(_forward, module)
            count += 1
    return count
