"""The compiled log-softmax passes (agentrl.algos.fused) against the eager ones and float64."""

import logging

import pytest
import torch

from agentrl.algos import chunked_logprobs_entropy
from agentrl.algos import fused as fused_kernels


def _naive(logits, labels, temperature):
    logp = torch.log_softmax(logits.double() / temperature, dim=-1)
    lp = logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    valid = labels >= 0
    return torch.where(valid, lp, 0.0), torch.where(valid, ent, 0.0)


def _run(hidden, weight, labels, coef, temperature, mode, amp, ent_w, chunk=24):
    hidden.grad = weight.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        lp, ent = chunked_logprobs_entropy(
            hidden, weight, labels, temperature, chunk=chunk, fused=mode
        )
    ((lp * coef).sum() + ent_w * ent.sum()).backward()
    return lp.detach(), ent.detach(), hidden.grad.clone(), weight.grad.clone()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("ent_w", [0.0, 0.4])
@pytest.mark.parametrize("amp", [False, True])
def test_compiled_matches_eager_and_float64(temperature, ent_w, amp):
    torch.manual_seed(11)
    N, H, V = 70, 16, 400  # 70 rows in chunks of 24: a short last chunk too
    hidden = (torch.randn(N, H) * 0.7).requires_grad_()
    weight = (torch.randn(V, H) * 0.7).requires_grad_()
    labels = torch.randint(0, V, (N,))
    labels[::9] = -100
    coef = torch.randn(N)
    on = _run(hidden, weight, labels, coef, temperature, "on", amp, ent_w)
    off = _run(hidden, weight, labels, coef, temperature, "off", amp, ent_w)

    h = hidden.detach().double().requires_grad_()
    w = weight.detach().double().requires_grad_()
    lp_ref, ent_ref = _naive(h @ w.t(), labels, temperature)
    ((lp_ref * coef.double()).sum() + ent_w * ent_ref.sum()).backward()
    ref = (lp_ref.detach(), ent_ref.detach(), h.grad, w.grad)

    same = {"atol": 1e-5, "rtol": 1e-5} if not amp else {"atol": 2e-2, "rtol": 2e-2}
    exact = {"atol": 1e-4, "rtol": 1e-4} if not amp else {"atol": 0.05, "rtol": 0.05}
    for a, b, r in zip(on, off, ref, strict=True):
        torch.testing.assert_close(a, b, **same)  # compiled == eager
        torch.testing.assert_close(a.double(), r, **exact)  # and both == float64
    assert (on[0][labels < 0] == 0).all() and (on[1][labels < 0] == 0).all()


def test_compiled_keeps_far_below_max_logprobs_exact():
    # the exp floor touches only the normaliser, in the compiled passes as in the eager ones
    hidden = torch.tensor([[1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    weight = torch.tensor([[300.0, 0.0], [0.0, 0.0], [0.0, -300.0]], requires_grad=True)
    labels = torch.tensor([1, 2])
    lp, ent = chunked_logprobs_entropy(hidden, weight, labels, fused="on")
    lp_ref, ent_ref = _naive(hidden.detach() @ weight.detach().t(), labels, 1.0)
    torch.testing.assert_close(lp.double(), lp_ref, atol=1e-4, rtol=1e-6)
    torch.testing.assert_close(ent.double(), ent_ref, atol=1e-4, rtol=0)
    (lp.sum() + ent.sum()).backward()
    assert torch.isfinite(hidden.grad).all() and torch.isfinite(weight.grad).all()


def test_when_to_compile():
    cpu, f32 = torch.device("cpu"), torch.float32
    assert fused_kernels.wanted("on", cpu, f32)
    assert not fused_kernels.wanted("off", cpu, f32)
    assert not fused_kernels.wanted("auto", cpu, torch.float64)  # gradchecks stay eager
    assert not fused_kernels.wanted("auto", torch.device("cuda"), f32)  # never run on CUDA
    with pytest.raises(ValueError, match="fused must be one of auto, on, off"):
        chunked_logprobs_entropy(
            torch.randn(2, 3), torch.randn(4, 3), torch.tensor([0, 1]), fused="yes"
        )


def test_a_compiler_failure_falls_back_once_in_auto_and_raises_in_on(monkeypatch, caplog):
    def broken(*args):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    monkeypatch.setattr(fused_kernels, "_compiled", {"forward": broken, "backward": broken})
    monkeypatch.setattr(fused_kernels, "_broken", None)
    torch.manual_seed(12)
    hidden = torch.randn(10, 4, requires_grad=True)
    weight = torch.randn(30, 4, requires_grad=True)
    labels = torch.randint(0, 30, (10,))
    coef = torch.randn(10)
    with caplog.at_level(logging.WARNING, logger="agentrl.algos.fused"):
        got = _run(hidden, weight, labels, coef, 1.0, "auto", False, 0.3, chunk=4)
        again = _run(hidden, weight, labels, coef, 1.0, "auto", False, 0.3, chunk=4)
    warnings = [r for r in caplog.records if "compiled log-prob kernel unavailable" in r.message]
    assert len(warnings) == 1 and "No working C++ compiler" in warnings[0].getMessage()
    assert fused_kernels._broken is not None
    eager = _run(hidden, weight, labels, coef, 1.0, "off", False, 0.3, chunk=4)
    for a, b, c in zip(got, again, eager, strict=True):
        torch.testing.assert_close(a, c)
        torch.testing.assert_close(b, c)
    with pytest.raises(RuntimeError, match=r"learner\.fused_logprobs=on"):
        _run(hidden, weight, labels, coef, 1.0, "on", False, 0.3, chunk=4)


@pytest.mark.parametrize("amp", [False, True])
def test_one_chunk_keeps_its_logits_for_the_backward(amp, monkeypatch):
    """Rows that fit one chunk: the compiled forward's logits serve the backward (no second
    LM-head matmul there), with the values and gradients of the recomputing path."""
    from agentrl.algos import logprobs

    torch.manual_seed(12)
    N, H, V = 40, 16, 400
    hidden = (torch.randn(N, H) * 0.7).requires_grad_()
    weight = (torch.randn(V, H) * 0.7).requires_grad_()
    labels = torch.randint(0, V, (N,))
    labels[::7] = -100
    coef = torch.randn(N)
    matmuls = []
    mm = torch.mm

    def counting_mm(a, b, **kw):
        if b.shape[-1] == V:  # [n, H] x [H, V]: the logits
            matmuls.append(a.shape[0])
        return mm(a, b, **kw)

    monkeypatch.setattr(logprobs.torch, "mm", counting_mm)
    kept = _run(hidden, weight, labels, coef, 1.0, "on", amp, 0.3, chunk=N)
    assert matmuls == [N]  # the forward's only
    matmuls.clear()
    recomputed = _run(hidden, weight, labels, coef, 1.0, "on", amp, 0.3, chunk=N - 1)
    assert len(matmuls) == 4  # two chunks, each in the forward and again in the backward
    same = {"atol": 1e-5, "rtol": 1e-5} if not amp else {"atol": 2e-2, "rtol": 2e-2}
    for a, b in zip(kept, recomputed, strict=True):
        torch.testing.assert_close(a, b, **same)
