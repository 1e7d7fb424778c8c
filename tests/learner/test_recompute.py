"""learner.recompute_mlp: the gated MLP keeps only its input for backward; values and
gradients are the plain module's."""

from __future__ import annotations

import copy

import pytest
import torch

from agentrl import cpu_linear
from agentrl.learner.recompute import GatedMLP, recompute_mlp
from agentrl.models import tiny_llama
from agentrl.run.settings import resolve


def _grads(model: torch.nn.Module, ids: torch.Tensor, autocast: bool) -> tuple[float, dict]:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=ids).logits
    loss = torch.log_softmax(logits.float(), -1)[..., 5].mean()
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_loss_and_gradients_match_the_plain_model(autocast: bool) -> None:
    plain = tiny_llama(seed=0)
    patched = copy.deepcopy(plain)
    layers = len(plain.model.layers)
    assert recompute_mlp(patched) == layers
    ids = torch.randint(
        0, plain.config.vocab_size, (3, 17), generator=torch.Generator().manual_seed(1)
    )
    loss_a, grads_a = _grads(plain, ids, autocast)
    loss_b, grads_b = _grads(patched, ids, autocast)
    tol = {"rtol": 2e-2, "atol": 2e-3} if autocast else {"rtol": 1e-4, "atol": 1e-6}
    assert loss_b == pytest.approx(loss_a, rel=tol["rtol"])
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], **tol, msg=name)
        assert grads_b[name].dtype == torch.float32


@pytest.mark.skipif(not cpu_linear.available(), reason="this torch has no oneDNN linear op")
def test_routed_projections_are_patched_and_match_the_plain_model() -> None:
    """model.cpu_linear=onednn swaps the projections' class to CpuLinear before the learner
    is built: recompute_mlp still applies, its products run through oneDNN, and loss and
    gradients are the plain model's (another GEMM library: float rounding only)."""
    plain = tiny_llama(seed=0)
    patched = copy.deepcopy(plain)
    assert cpu_linear.route_linears(patched, "onednn") == "onednn"
    assert recompute_mlp(patched) == len(plain.model.layers)
    ids = torch.randint(
        0, plain.config.vocab_size, (3, 17), generator=torch.Generator().manual_seed(1)
    )
    loss_a, grads_a = _grads(plain, ids, autocast=False)
    loss_b, grads_b = _grads(patched, ids, autocast=False)
    assert loss_b == pytest.approx(loss_a, rel=1e-4)
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-3, atol=1e-5, msg=name)


def test_only_the_input_is_kept_for_backward() -> None:
    """What autograd saves for one MLP: its input and the weights, not the four
    intermediate-wide activations."""
    mlp = tiny_llama(seed=0).model.layers[0].mlp
    x = torch.randn(4, 9, mlp.gate_proj.in_features, requires_grad=True)
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        GatedMLP.apply(x, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
    inter = mlp.gate_proj.out_features
    assert not any(t.shape[-1] == inter and t.dim() == 3 for t in saved)
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        mlp(x)  # the plain module keeps them
    assert any(t.shape[-1] == inter and t.dim() == 3 for t in saved)
    assert recompute_mlp(mlp) == 1
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        mlp(x)
    assert sum(t.numel() for t in saved if t.dim() == 3) == x.numel()


def test_other_mlps_are_left_alone() -> None:
    model = tiny_llama(seed=0)
    model.model.layers[0].mlp.act_fn = torch.nn.GELU()
    model.model.layers[1].mlp.up_proj = torch.nn.Linear(
        model.config.hidden_size, model.config.intermediate_size, bias=True
    )
    assert recompute_mlp(model) == len(model.model.layers) - 2


def test_no_grad_forward_runs_the_plain_module() -> None:
    model = tiny_llama(seed=0)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
        recompute_mlp(model)
        after = model(input_ids=ids).logits
    assert torch.equal(before, after)


def test_a_learner_step_matches_the_plain_learner(fresh_model, groups) -> None:
    """learner.recompute_mlp through the Learner: the same loss and updated weights as
    without it (up to float rounding)."""
    from agentrl.learner import Learner
    from tests.close import assert_trained_alike, flat
    from tests.learner.conftest import make_cfg

    plain = Learner(fresh_model(), None, resolve(make_cfg()).learner)
    patched = Learner(
        fresh_model(), None, resolve(make_cfg(learner={"recompute_mlp": True})).learner
    )
    assert all(
        "_forward" in getattr(layer.mlp.forward, "__name__", "")
        for layer in patched.model.model.layers
    )
    for _ in range(2):
        a, b = plain.step(groups), patched.step(groups)
        assert b["loss/total"] == pytest.approx(a["loss/total"], rel=1e-4, abs=1e-6)
    assert_trained_alike(flat(patched.model), flat(plain.model), flat(fresh_model()))
