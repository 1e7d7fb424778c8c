"""Rounded bf16 matmuls (agentrl.algos.bf16): the arithmetic of CPU bf16 autocast on
float32 GEMMs. Compared with torch's own bf16 kernels, which differ only in the order of
their float32 additions: nearly every element is identical, the rest one bf16 step away."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from agentrl.algos import bf16, chunked_logprobs_entropy

BF = torch.bfloat16


def _autocast() -> torch.autocast:
    return torch.autocast("cpu", dtype=BF)


def _close_to_torch(got: torch.Tensor, want: torch.Tensor, share: float = 0.99) -> None:
    """`got` is `want` up to float32 accumulation order: the same dtype and shape, at least
    `share` of the elements identical, every one within a couple of bf16 rounding steps of
    the value's magnitude or of the tensor's scale (a sum that cancels rounds on a scale
    set by its terms, not by its small result)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.float(), want.float()
    assert (g == w).float().mean().item() >= share
    step = 2.0**-7 * (w.abs() + w.abs().mean())
    assert bool(((g - w).abs() <= 2 * step).all()), (g - w).abs().max()


def _linear_grads(x, w, b, rounded: bool):
    leaves = [t.detach().clone().requires_grad_() for t in (x, w) + ((b,) if b is not None else ())]
    with _autocast():
        if rounded:
            with bf16.rounded_matmuls():
                y = F.linear(*leaves)
        else:
            y = F.linear(*leaves)
    up = torch.randn(y.shape, generator=torch.Generator().manual_seed(3))
    (y.float() * up).sum().backward()
    return y, [t.grad for t in leaves]


@pytest.mark.parametrize("x_dtype", [torch.float32, BF])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_forward_and_backward_match_torch_autocast(x_dtype, bias) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 37, 96, generator=gen).to(x_dtype)
    w = torch.randn(160, 96, generator=gen) * 0.1
    b = torch.randn(160, generator=gen) if bias else None
    y_t, grads_t = _linear_grads(x, w, b, rounded=False)
    y_r, grads_r = _linear_grads(x, w, b, rounded=True)
    assert y_r.dtype == BF and y_r.grad_fn is not None
    assert type(y_r.grad_fn).__name__ == "RoundedLinearBackward"
    _close_to_torch(y_r, y_t)
    for got, want in zip(grads_r, grads_t, strict=True):
        _close_to_torch(got, want)  # x's gradient in x's dtype, w's (and b's) in float32
    # the gradients hold bf16 values, as autocast's (rounded, then widened) do
    for got in grads_r[1:]:
        assert torch.equal(got, got.to(BF).float())


def test_products_without_gradients_are_rounded() -> None:
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(2, 24, 64, generator=gen), torch.randn(2, 64, 40, generator=gen)
    calls = {
        "mm": lambda p, q: p[0].mm(q[0]),
        "torch.mm": lambda p, q: torch.mm(p[0], q[0]),
        "matmul": lambda p, q: torch.matmul(p, q),
        "@": lambda p, q: p @ q,
        "bmm": lambda p, q: p.bmm(q),
    }
    for name, call in calls.items():
        with torch.no_grad(), _autocast():
            want = call(a, b)
            with bf16.rounded_matmuls():
                got = call(a, b)
        assert got.dtype == BF, name
        _close_to_torch(got, want)
        # and the exact product of the bf16-rounded operands, rounded once to bf16
        exact = call(bf16.widened(a).double(), bf16.widened(b).double())
        _close_to_torch(got, exact.to(BF))


def test_nothing_changes_outside_bf16_autocast() -> None:
    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(5, 32, generator=gen), torch.randn(16, 32, generator=gen)
    with bf16.rounded_matmuls():
        assert not bf16.active()
        assert torch.equal(F.linear(x, w), x @ w.t())  # float32, untouched
        with torch.autocast("cpu", dtype=torch.float16):
            assert not bf16.active()
        with _autocast():
            assert bf16.active() and not bf16.active("cuda")
            with torch.autocast("cpu", enabled=False):
                assert not bf16.active()
                assert F.linear(x, w).dtype == torch.float32
            with bf16.rounded_matmuls():  # nests
                assert bf16.active()
            assert bf16.active()
            # a float64 operand is autocast's business (it leaves float64 alone)
            assert F.linear(x.double(), w.double()).dtype == torch.float64
    with _autocast():
        assert not bf16.active()


def test_a_product_that_records_gradients_is_left_to_autocast() -> None:
    """Only F.linear has a rounded backward; a bare matmul that needs one runs as torch's."""
    gen = torch.Generator().manual_seed(4)
    a = torch.randn(8, 16, generator=gen, requires_grad=True)
    b = torch.randn(16, 4, generator=gen)
    with _autocast(), bf16.rounded_matmuls():
        y = a @ b
    assert y.dtype == BF and type(y.grad_fn).__name__ == "MmBackward0"


def test_round_in_place_is_the_bf16_cast() -> None:
    t = torch.randn(1000, generator=torch.Generator().manual_seed(5)) * 1e3
    want = t.to(BF).float()
    assert bf16.round_(t) is t and torch.equal(t, want)


@pytest.fixture
def own_compile_budget():
    """The compiled log-prob kernels (``fused="auto"``) get a variant per input dtype and
    per torch-function-mode state; torch caches them per process with a recompile limit,
    which later tests compiling with ``fused="on"`` need: give the cache back empty."""
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("with_entropy", [False, True])
@pytest.mark.parametrize("fused", ["auto", "off"])
def test_lm_head_logprobs_match_torch_autocast(
    with_entropy, fused, monkeypatch, own_compile_budget
) -> None:
    """The fused LM-head function rounds its own matmuls under rounded_matmuls: values and
    gradients as torch's bf16 autocast gives them (two chunks, three vocabulary slices, a
    masked label)."""
    monkeypatch.setattr(bf16, "WEIGHT_SLICE", 128)
    gen = torch.Generator().manual_seed(6)
    hidden = torch.randn(40, 64, generator=gen)
    weight = torch.randn(300, 64, generator=gen) * 0.2
    labels = torch.randint(0, 300, (40,), generator=gen)
    labels[7] = -100

    def run(rounded: bool):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with _autocast():
            if rounded:
                with bf16.rounded_matmuls():
                    lp, ent = chunked_logprobs_entropy(
                        h, w, labels, chunk=24, with_entropy=with_entropy, fused=fused
                    )
            else:
                lp, ent = chunked_logprobs_entropy(
                    h, w, labels, chunk=24, with_entropy=with_entropy, fused=fused
                )
        loss = lp.sum() + (ent.sum() * 0.3 if ent is not None else 0)
        loss.backward()
        return lp.detach(), h.grad, w.grad

    got, want = run(True), run(False)
    fp32 = chunked_logprobs_entropy(hidden, weight, labels, chunk=24, with_entropy=False)[0]
    # bf16 logits: far from the float32 values, within float32 rounding of torch's bf16 ones
    assert (want[0] - fp32).abs().max() > 1e-3
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-4)
    for g, w in zip(got[1:], want[1:], strict=True):
        assert g.dtype == w.dtype == torch.float32
        # a logit one bf16 step apart moves its probability by up to ~1.5%, and torch's
        # path rounds the weight's gradient per chunk (this one once, after the sum), so a
        # few elements are more than a step of their own value apart
        torch.testing.assert_close(g, w, rtol=2**-7, atol=2**-7 * w.abs().max().item())
        assert ((g - w).abs() <= 2**-7 * w.abs()).float().mean() > 0.9
        assert torch.equal(g, g.to(BF).float())  # rounded to bf16, as autocast's products


def test_projections_of_one_input_keep_one_bf16_copy_of_it() -> None:
    """q/k/v read one float32 input: one bf16 copy of it is saved for the three backwards
    (autocast saves one per projection), and an input changed in place is rounded again."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(6, 32, generator=gen, requires_grad=True)
    ws = [torch.randn(16, 32, generator=gen, requires_grad=True) for _ in range(3)]
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    with hooks, _autocast(), bf16.rounded_matmuls():
        h = x * 1.0
        outs = [F.linear(h, w) for w in ws]
    copies = {t.data_ptr() for t in saved if t.dtype == BF and t.shape == x.shape}
    assert len(copies) == 1
    sum(o.float().sum() for o in outs).backward()
    assert all(w.grad is not None for w in ws) and x.grad is not None

    with torch.no_grad(), _autocast(), bf16.rounded_matmuls():
        y = torch.randn(6, 32, generator=gen)
        first = F.linear(y, ws[0])
        y.mul_(2)  # in place: the next projection must not reuse the old rounding
        assert torch.equal(F.linear(y, ws[0]).float(), (first.float() * 2))


def test_a_product_with_a_non_tensor_operand_fails_as_torch_fails() -> None:
    with _autocast(), bf16.rounded_matmuls(), pytest.raises(TypeError):
        torch.matmul(torch.ones(2, 2), [[1.0, 0.0], [0.0, 1.0]])
