import pytest
import torch

from agentrl.algos import (
    chunked_logprobs_entropy,
    entropy_from_logits,
    logprobs_from_logits,
    sequence_logprobs_entropy,
)


def _naive(logits, labels, temperature=1.0):
    z = logits.double() / (temperature or 1.0)
    logp = torch.log_softmax(z, dim=-1)
    lp = logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    valid = labels >= 0
    return torch.where(valid, lp, 0.0), torch.where(valid, ent, 0.0)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_logits_path_matches_naive(temperature, chunk):
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11) * 3
    labels = torch.randint(0, 11, (2, 5))
    labels[1, 4] = -100
    lp = logprobs_from_logits(logits, labels, temperature=temperature, chunk=chunk)
    ent = entropy_from_logits(logits, temperature=temperature, chunk=chunk, labels=labels)
    lp_ref, ent_ref = _naive(logits, labels, temperature)
    assert lp.dtype == torch.float32 and lp.shape == (2, 5)
    torch.testing.assert_close(lp.double(), lp_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent.double(), ent_ref, atol=1e-5, rtol=1e-5)
    assert lp[1, 4] == 0 and ent[1, 4] == 0


def test_bf16_logits_are_upcast():
    torch.manual_seed(1)
    logits = (torch.randn(3, 50) * 4).bfloat16()
    labels = torch.randint(0, 50, (3,))
    lp = logprobs_from_logits(logits, labels, chunk=2)
    torch.testing.assert_close(lp.double(), _naive(logits.float(), labels)[0], atol=1e-5, rtol=0)


def test_hidden_path_matches_naive_forward_and_gradients():
    torch.manual_seed(2)
    B, T, H, V = 2, 7, 6, 13
    hidden = torch.randn(B, T, H, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(V, H, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, V, (B, T))
    coef = torch.randn(B, T, dtype=torch.float64)

    lp, ent = chunked_logprobs_entropy(hidden, weight, labels, temperature=0.8, chunk=4)
    ((lp * coef).sum() + 0.3 * ent.sum()).backward()
    g_hidden, g_weight = hidden.grad.clone(), weight.grad.clone()

    hidden.grad = weight.grad = None
    lp_ref, ent_ref = _naive(hidden @ weight.t(), labels, 0.8)
    ((lp_ref * coef).sum() + 0.3 * ent_ref.sum()).backward()
    # outputs are float32 by contract; compare at float32 precision
    torch.testing.assert_close(lp.double(), lp_ref.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent.double(), ent_ref.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(g_hidden, hidden.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(g_weight, weight.grad, atol=1e-5, rtol=1e-4)


def test_backward_never_saves_a_full_logits_tensor():
    torch.manual_seed(3)
    N, H, V, chunk = 64, 8, 97, 8
    hidden = torch.randn(N, H, requires_grad=True)
    weight = torch.randn(V, H, requires_grad=True)
    labels = torch.randint(0, V, (N,))
    saved: list[tuple[int, ...]] = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    # what autograd keeps between forward and backward: the inputs, never [*, V] logits
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, ent = chunked_logprobs_entropy(hidden, weight, labels, chunk=chunk)
    assert saved and all(shape[-1] != V for shape in saved if shape != (V, H))
    (lp.sum() + ent.sum()).backward()
    assert hidden.grad is not None and weight.grad is not None


def test_sequence_alignment_follows_types_convention():
    torch.manual_seed(4)
    hidden = torch.randn(2, 5, 4)
    weight = torch.randn(9, 4)
    ids = torch.randint(0, 9, (2, 5))
    lp, ent = sequence_logprobs_entropy(hidden, weight, ids, chunk=3)
    assert lp.shape == (2, 5) and (lp[:, 0] == 0).all() and (ent[:, 0] == 0).all()
    ref, _ = _naive(hidden[:, :-1] @ weight.t(), ids[:, 1:])
    torch.testing.assert_close(lp[:, 1:].double(), ref, atol=1e-5, rtol=1e-5)


def test_no_entropy_and_bad_inputs():
    lp, ent = chunked_logprobs_entropy(
        torch.randn(3, 4), torch.randn(5, 4), torch.tensor([0, 1, 2]), with_entropy=False
    )
    assert ent is None and lp.shape == (3,)
    with pytest.raises(ValueError, match="lm_head_weight"):
        chunked_logprobs_entropy(torch.randn(3, 4), torch.randn(5, 3), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="temperature"):
        logprobs_from_logits(torch.randn(2, 3), torch.tensor([0, 1]), temperature=-1.0)
    with pytest.raises(ValueError, match="chunk"):
        logprobs_from_logits(torch.randn(2, 3), torch.tensor([0, 1]), chunk=0)


@pytest.mark.parametrize("which", ["both", "logprobs", "entropy"])
def test_hidden_path_passes_gradcheck(which):
    torch.manual_seed(5)
    hidden = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 6, -100, 3, 2])

    def fn(h, w):
        lp, ent = chunked_logprobs_entropy(h, w, labels, temperature=0.6, chunk=2)
        if which == "logprobs":
            return lp
        if which == "entropy":
            return ent
        return lp + 0.5 * ent

    assert torch.autograd.gradcheck(fn, (hidden, weight), eps=1e-6, atol=1e-5)


def test_hidden_path_bf16_gradients_close_to_float32():
    torch.manual_seed(6)
    h32 = torch.randn(6, 8, requires_grad=True)
    w32 = (torch.randn(20, 8) * 0.3).requires_grad_()
    labels = torch.randint(0, 20, (6,))
    h16 = h32.detach().bfloat16().requires_grad_()
    w16 = w32.detach().bfloat16().requires_grad_()
    for h, w in ((h32, w32), (h16, w16)):
        lp, ent = chunked_logprobs_entropy(h, w, labels, chunk=4)
        (lp.sum() + ent.sum()).backward()
    assert h16.grad.dtype == torch.bfloat16 and w16.grad.dtype == torch.bfloat16
    torch.testing.assert_close(h16.grad.float(), h32.grad, atol=0.1, rtol=0.05)
    torch.testing.assert_close(w16.grad.float(), w32.grad, atol=0.1, rtol=0.05)


def test_far_below_max_tokens_keep_their_exact_logprob():
    # the exp floor only touches the normaliser; a label 300 nats under the max stays exact
    hidden = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    weight = torch.tensor([[300.0, 0.0], [0.0, 0.0], [0.0, -300.0]], dtype=torch.float64)
    labels = torch.tensor([1, 2])
    lp, ent = chunked_logprobs_entropy(hidden, weight, labels, temperature=1.0)
    lp_ref, ent_ref = _naive(hidden @ weight.t(), labels)
    torch.testing.assert_close(lp.double(), lp_ref, atol=1e-6, rtol=1e-9)
    torch.testing.assert_close(ent.double(), ent_ref, atol=1e-6, rtol=0)
    assert lp[0] < -299 and lp[1] < -299


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_autocast_bf16_matches_float32_with_entropy_unused_or_used(temperature):
    # under bf16 autocast the LM-head matmuls run in bf16 in both directions (like autocast);
    # an entropy output left out of the loss must not change the gradients
    torch.manual_seed(7)
    hidden = (torch.randn(40, 16) * 0.5).requires_grad_()
    weight = (torch.randn(300, 16) * 0.5).requires_grad_()
    labels = torch.randint(0, 300, (40,))
    labels[3] = -100
    coef = torch.randn(40)
    grads = {}
    for name, amp, ent_w in (("fp32", False, 0.0), ("bf16", True, 0.0), ("bf16+H", True, 0.3)):
        hidden.grad = weight.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            lp, ent = chunked_logprobs_entropy(hidden, weight, labels, temperature, chunk=16)
        assert lp.dtype == torch.float32 and ent.dtype == torch.float32
        ((lp * coef).sum() + (ent_w * ent.sum() if ent_w else 0.0)).backward()
        grads[name] = (lp.detach(), ent.detach(), hidden.grad.clone(), weight.grad.clone())
    ref = {}
    for name, ent_w in (("fp32", 0.0), ("bf16+H", 0.3)):
        h = hidden.detach().double().requires_grad_()
        w = weight.detach().double().requires_grad_()
        lp_ref, ent_ref = _naive(h @ w.t(), labels, temperature)
        ((lp_ref * coef.double()).sum() + ent_w * ent_ref.sum()).backward()
        ref[name] = (lp_ref.detach(), ent_ref.detach(), h.grad, w.grad)
    ref["bf16"] = ref["fp32"]
    for name, (lp, ent, gh, gw) in grads.items():
        tol = {"atol": 1e-4, "rtol": 1e-4} if name == "fp32" else {"atol": 0.05, "rtol": 0.05}
        lp_ref, ent_ref, gh_ref, gw_ref = ref[name]
        torch.testing.assert_close(lp.double(), lp_ref, **tol)
        torch.testing.assert_close(ent.double(), ent_ref, **tol)
        torch.testing.assert_close(gh.double(), gh_ref, **tol)
        torch.testing.assert_close(gw.double(), gw_ref, **tol)
