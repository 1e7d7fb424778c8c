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
bias-free ``nn.Linear`` projections, routed to oneDNN or not (``model.cpu_linear``; Llama,
Mistral, Qwen2, SmolLM); anything else (LoRA
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

from agentrl import cpu_linear


class GatedMLP(torch.autograd.Function):
    """``down(silu(x @ Wg^T) * (x @ Wu^T))`` keeping only `x` (and the weights) for
    backward. Under autocast the backward recomputes with the forward's autocast state.
    With `onednn` (the projections are :class:`~agentrl.cpu_linear.CpuLinear`) the float32
    CPU products, forward and backward, run through oneDNN as the routed layers' do."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(
        ctx: Any, x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor, onednn: bool = False
    ) -> Tensor:
        ctx.save_for_backward(x, w_gate, w_up, w_down)
        ctx.onednn = onednn
        lin = cpu_linear.linear if onednn else F.linear
        return lin(F.silu(lin(x, w_gate)) * lin(x, w_up), w_down)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, w_gate, w_up, w_down = ctx.saved_tensors
        lin = cpu_linear.linear if ctx.onednn else F.linear
        with torch.no_grad():
            gate, up = lin(x, w_gate), lin(x, w_up)
            sig = torch.sigmoid(gate)
            act = gate * sig  # silu(gate)
            prod = act * up
            grad = grad.to(prod.dtype)
            g2 = grad.reshape(-1, grad.shape[-1])
            # a @ b as lin(a, b^T): oneDNN takes any strides
            d_down = lin(g2.t(), prod.reshape(-1, prod.shape[-1]).t())
            d_prod = lin(grad, w_down.to(grad.dtype).t())
            d_up = d_prod * act
            d_gate = d_prod * up * (sig * (1 + gate * (1 - sig)))  # silu'(gate)
            x2 = x.reshape(-1, x.shape[-1]).to(d_gate.dtype)
            d_w_gate = lin(d_gate.reshape(-1, d_gate.shape[-1]).t(), x2.t())
            d_w_up = lin(d_up.reshape(-1, d_up.shape[-1]).t(), x2.t())
            d_x = lin(d_gate, w_gate.to(d_gate.dtype).t()) + lin(d_up, w_up.to(d_up.dtype).t())
        return (
            d_x.to(x.dtype),
            d_w_gate.to(w_gate.dtype),
            d_w_up.to(w_up.dtype),
            d_down.to(w_down.dtype),
            None,
        )


def _applies(mlp: torch.nn.Module) -> bool:
    projections = [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    if not all(type(p) in _LINEARS and p.bias is None for p in projections):
        return False  # LoRA-wrapped, biased, or another layout
    if mlp.gate_proj.weight.device.type != "cpu":
        return False  # the recompute follows CPU autocast only (GatedMLP's custom_bwd)
    # torch's SiLU, or transformers' SiLUActivation (ACT2FN["silu"])
    if type(getattr(mlp, "act_fn", None)).__name__ not in ("SiLU", "SiLUActivation"):
        return False
    # exactly the Llama forward (a subclass that changes it is left alone)
    return LLAMA_MLP in _source(type(mlp).forward)


_LINEARS = (torch.nn.Linear, cpu_linear.CpuLinear)  # routed to oneDNN or not
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
    onednn = type(self.gate_proj) is cpu_linear.CpuLinear
    return GatedMLP.apply(
        x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight, onednn
    )


def recompute_mlp(model: torch.nn.Module) -> int:
    """Patch every gated MLP of `model` (see the module docstring); returns how many."""
    count = 0
    for module in model.modules():
        if _applies(module):
            module.forward = types.MethodType(_forward, module)
            count += 1
    return count
