"""model.cpu_linear: float32 CPU linear layers through oneDNN, the same arithmetic as torch's
own linear up to float rounding, forward and backward; everything it cannot serve falls back."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from agentrl import cpu_linear
from agentrl.config import load_config
from agentrl.cpu_linear import CpuLinear, choose, linear, route_linears, unroute_linears
from agentrl.errors import ConfigError
from agentrl.models import load_model

pytestmark = pytest.mark.skipif(not cpu_linear.available(), reason="torch without oneDNN")


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-5) -> bool:
    """Within float32 rounding of another summation order, relative to b's scale."""
    return bool((a - b).abs().max() <= rtol * b.abs().max())


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(7, 96), (2, 9, 96), (1, 96)])
def test_forward_and_every_gradient_match_torchs_linear(bias: bool, shape: tuple[int, ...]):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(80, 96, generator=gen, requires_grad=True)
    b = torch.randn(80, generator=gen, requires_grad=True) if bias else None
    x = torch.randn(*shape, generator=gen, requires_grad=True)
    r = torch.randn(*shape[:-1], 80, generator=gen)  # a linear loss: grads are products

    def grads(fn):
        y = fn(x, w, b)
        (y * r).sum().backward()
        out = [y.detach(), x.grad, w.grad] + ([b.grad] if b is not None else [])
        out = [t.clone() for t in out]
        for t in (x, w, b):
            if t is not None:
                t.grad = None
        return out, y.grad_fn

    theirs, _ = grads(F.linear)
    ours, fn = grads(linear)
    assert type(fn).__name__ == "_OneDNNLinearBackward"  # it did take the oneDNN path
    assert all(_close(a, c) for a, c in zip(ours, theirs, strict=True))


def test_what_it_cannot_serve_goes_to_torchs_linear():
    w = torch.randn(16, 32, requires_grad=True)
    x = torch.randn(4, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast: torch's bf16 path
        y = linear(x, w)
    assert y.dtype == torch.bfloat16
    assert "OneDNN" not in type(y.grad_fn).__name__
    y = linear(x.bfloat16(), w.bfloat16())  # not float32
    assert y.dtype == torch.bfloat16 and "OneDNN" not in type(y.grad_fn).__name__
    with torch.no_grad():  # no grad: still oneDNN, the same values
        assert _close(linear(x, w), F.linear(x, w))


def test_a_quantized_weight_is_left_to_its_own_kernel():
    torchao = pytest.importorskip("torchao.quantization")
    model = torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False))
    route_linears(model, "onednn")
    torchao.quantize_(model, torchao.Int8WeightOnlyConfig(set_inductor_config=False))
    x = torch.randn(3, 64)
    with torch.no_grad():
        y = model(x)  # the torchao tensor's own linear: no oneDNN call on a subclass
    assert y.shape == (3, 64) and torch.isfinite(y).all()


def test_route_swaps_plain_linears_only_and_keeps_names_values_and_copies():
    model, _ = load_model("tiny-llama", dtype="float32")

    class Mine(torch.nn.Linear):  # a subclass has its own forward: left alone
        pass

    model.extra = Mine(4, 4)
    keys = list(model.state_dict())
    ids = torch.randint(0, 100, (2, 7))
    with torch.no_grad():
        before = model(ids).logits
    assert route_linears(model, "onednn") == "onednn"
    swapped = [m for m in model.modules() if type(m) is CpuLinear]
    plain = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(swapped) == len(plain) - 1 and type(model.extra) is Mine
    assert type(model.lm_head) is CpuLinear
    assert list(model.state_dict()) == keys
    with torch.no_grad():
        assert _close(model(ids).logits, before)
    twin = copy.deepcopy(model)
    assert type(twin.lm_head) is CpuLinear and twin.lm_head is not model.lm_head
    unroute_linears(model)
    assert not any(type(m) is CpuLinear for m in model.modules())


def test_torch_mode_changes_nothing_and_auto_says_what_it_measured():
    model, _ = load_model("tiny-llama", dtype="float32")
    assert route_linears(model, "torch") == "torch"
    assert not any(type(m) is CpuLinear for m in model.modules())
    # tiny layers stay on torch's path untimed: a timing of microseconds is noise
    assert choose(model, "auto") == (
        "torch",
        "linear 64->64: too narrow to time the libraries apart",
    )
    wide = torch.nn.Sequential(torch.nn.Linear(256, 384), torch.nn.Linear(256, 384))
    kernel, why = choose(wide, "auto", (16,))
    assert kernel in ("onednn", "torch")
    assert "at 16 rows" in why and "oneDNN vs torch" in why  # the measured ratio, for the log


def test_bad_modes_and_a_torch_without_onednn_are_config_errors(monkeypatch):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    with pytest.raises(ConfigError, match=r"model.cpu_linear must be one of auto, onednn, torch"):
        route_linears(model, "mkl")
    monkeypatch.setattr(cpu_linear, "available", lambda: False)
    with pytest.raises(ConfigError, match=r"model.cpu_linear=onednn.*auto or torch"):
        route_linears(model, "onednn")
    assert route_linears(model, "auto") == "torch"
    with pytest.raises(Exception, match="cpu_linear"):
        load_config(overrides=["model.cpu_linear=mkl"])


def test_a_run_trains_the_same_with_onednn_linears_in_the_sampler_and_the_learner(
    tmp_path: Path,
):
    from tests.orchestrator.test_train import _run

    seeded = ["orchestrator.max_staleness=0", "sampler.seed=7", "orchestrator.seed=7"]
    seeded.append("orchestrator.max_steps=2")
    ours = _run(tmp_path / "onednn", *seeded, "model.cpu_linear=onednn")
    theirs = _run(tmp_path / "torch", *seeded, "model.cpu_linear=torch")
    for model in (ours.sampler.model, ours.learner.model):
        assert type(model.lm_head) is CpuLinear
    for model in (theirs.sampler.model, theirs.learner.model):
        assert not any(type(m) is CpuLinear for m in model.modules())
    # the same training up to rounding: the runs differ far less than either moved
    initial, _ = load_model("tiny-llama", dtype="float32")
    flat = [
        torch.cat([t.flatten() for t in m.state_dict().values()])
        for m in (ours.learner.model, theirs.learner.model, initial)
    ]
    moved = (flat[0] - flat[2]).abs().mean()
    assert moved > 0 and (flat[0] - flat[1]).abs().mean() < 0.05 * moved


@pytest.mark.parametrize("chunk", [5, 64])  # several chunks; one (its logits kept)
def test_the_learners_lm_head_products_by_onednn_match_torchs(chunk: int):
    from agentrl.algos import chunked_logprobs_entropy

    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(23, 32, generator=gen, requires_grad=True)
    weight = torch.randn(300, 32, generator=gen, requires_grad=True)
    labels = torch.randint(0, 300, (23,), generator=gen)
    labels[3] = -100  # padding: log-prob 0
    r = torch.randn(2, 23, generator=gen)

    def run(onednn: bool) -> list[torch.Tensor]:
        lp, ent = chunked_logprobs_entropy(
            hidden, weight, labels, temperature=0.7, chunk=chunk, onednn=onednn
        )
        ((lp * r[0]).sum() + (ent * r[1]).sum()).backward()
        out = [lp.detach(), ent.detach(), hidden.grad.clone(), weight.grad.clone()]
        hidden.grad = weight.grad = None
        return out

    theirs, ours = run(False), run(True)
    assert all(_close(a, b, rtol=1e-4) for a, b in zip(ours, theirs, strict=True))
