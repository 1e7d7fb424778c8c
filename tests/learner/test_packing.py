"""Sequence packing and activation checkpointing: the same function of the weights as the
padded forward (values and gradients), through every learner path that uses them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from agentrl.learner import Learner
from agentrl.learner.forward import Packing, checkpointing_active, packed_logprobs, token_logprobs
from agentrl.run.settings import resolve
from agentrl.types import Batch, TrajectoryGroup
from tests.learner.conftest import make_cfg
from tests.learner.test_learner import _shared_prompt_groups

LENGTHS = [40, 25, 12, 33]  # real tokens per row: 30% of the padded [4, 40] is padding


def _rows(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids [4, 40], a loss mask on each row's second half, and the lengths."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(LENGTHS)
    T = max(LENGTHS)
    ids = torch.randint(3, 49152, (len(LENGTHS), T), generator=gen)
    mask = torch.zeros(len(LENGTHS), T)
    for i, n in enumerate(LENGTHS):
        ids[i, n:] = 0  # padding
        mask[i, n // 2 : n] = 1
    return ids, mask, lengths


def _grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_packing_layout() -> None:
    """First-fit by decreasing length into rows of the longest sequence, or one row; the
    position ids restart per sequence (and per padding tail); pack/unpack round-trips."""
    lengths = torch.tensor(LENGTHS)
    rows = Packing.of(lengths, 40, torch.device("cpu"))
    assert (rows.rows, rows.width) == (3, 40) and rows.saves()  # [40], [33], [25 + 12]
    assert rows.positions[2].tolist() == [*range(25), *range(12), *range(3)]
    one = Packing.of(lengths, 40, torch.device("cpu"), width=int(lengths.sum()))
    assert (one.rows, one.width) == (1, 110)
    assert not Packing.of(torch.tensor([40, 39, 38]), 40, torch.device("cpu")).saves()
    x = torch.randn(4, 40, 3)
    valid = torch.arange(40)[None] < lengths[:, None]
    for packing in (rows, one):
        back = packing.unpack(packing.pack(x))
        assert torch.equal(back[valid], x[valid]) and torch.all(back[~valid] == 0)


@pytest.mark.parametrize("one_row", [False, True], ids=["rows", "one-row"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_forward_equals_padded(
    attn: str, one_row: bool, fresh_model: Callable[[], torch.nn.Module]
) -> None:
    """Per-token log-probs, entropy, hidden states and gradients agree; no token of one
    sequence sees another (changing a sequence leaves the others' log-probs unchanged)."""
    model = fresh_model()
    model.config._attn_implementation = attn
    ids, mask, lengths = _rows()
    packing = Packing.of(lengths, ids.shape[1], ids.device, width=110 if one_row else None)
    valid = torch.arange(ids.shape[1])[None] < lengths[:, None]
    out = {}
    for name in ("padded", "packed"):
        model.zero_grad(set_to_none=True)
        if name == "padded":
            o = token_logprobs(model, ids, mask, with_entropy=True, keep_hidden=True)
        else:
            o = packed_logprobs(
                model, ids, mask, packing=packing, with_entropy=True, keep_hidden=True
            )
        assert o.entropy is not None and o.hidden is not None
        # gradients through every output, hidden states (a value head's input) included
        (o.logprobs.sum() + o.entropy.sum() + o.hidden[valid].pow(2).mean()).backward()
        out[name] = (o.logprobs.detach(), o.entropy.detach(), o.hidden.detach(), _grads(model))
    (lp_a, ent_a, h_a, g_a), (lp_b, ent_b, h_b, g_b) = out["padded"], out["packed"]
    torch.testing.assert_close(lp_b, lp_a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_b, ent_a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h_b[valid], h_a[valid], atol=1e-5, rtol=1e-5)
    assert torch.all(lp_b[mask == 0] == 0) and torch.all(h_b[~valid] == 0)
    torch.testing.assert_close(g_b, g_a, atol=1e-5, rtol=1e-4)
    # block-diagonal attention: sequence 1 comes right before sequence 2 in a packed row
    # (both layouts); other tokens there change nothing in any other sequence
    other = ids.clone()
    other[1, : LENGTHS[1]] = torch.randint(3, 49152, (LENGTHS[1],))
    with torch.no_grad():
        lp_other = packed_logprobs(model, other, mask, packing=packing).logprobs
    assert not torch.allclose(lp_other[1], lp_b[1])
    keep = [0, 2, 3]
    torch.testing.assert_close(lp_other[keep], lp_b[keep], atol=1e-5, rtol=1e-5)


def _step_and_grads(
    learner: Learner, groups: list[TrajectoryGroup]
) -> tuple[dict[str, float], torch.Tensor, torch.Tensor]:
    """A micro-batch's gradients through PolicyForward, then one learner step."""
    batch = Batch.from_groups(groups)
    layout = learner.layout(batch)
    learner.model.train()
    learner.optimizer.zero_grad(set_to_none=True)
    total = torch.zeros(())
    for idx, L, P in layout.micro_batches(torch.arange(batch.size)):
        m = batch.loss_mask[idx, :L]
        lp, ent, values = learner.forward(
            learner.model, batch.input_ids[idx, :L], m,
            with_entropy=True, with_values=learner.use_critic, prefix_len=P,
            lengths=layout.lengths[idx],
        )  # fmt: skip
        assert ent is not None
        loss = (lp * m).sum() + (ent * m).sum()
        if values is not None:
            loss = loss + (values * m).sum()
        loss.backward()
        total = total + loss.detach()
    grads = torch.cat([p.grad.flatten() for p in learner.trained_parameters()])
    learner.optimizer.zero_grad(set_to_none=True)
    lp_all = learner.compute_logprobs(batch)
    return learner.step(groups), grads, lp_all


@pytest.mark.parametrize(
    ("alg", "share"),
    [
        ({"off_policy": "tis"}, False),
        ({"advantage": "gae", "critic": True}, False),  # a separate critic, packed too
        ({"off_policy": "tis"}, True),  # shared-prompt micro-batches keep their path
    ],
    ids=["tis", "ppo-critic", "share-prompt"],
)
def test_learner_step_with_packing_equals_padded(
    alg: dict,
    share: bool,
    fresh_model: Callable[[], torch.nn.Module],
    base_model: torch.nn.Module,
    groups: list[TrajectoryGroup],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A learner step with packing on computes what the padded step does, and trains.
    With shared prompts, the micro-batches of a group's rows keep the shared-prompt path."""
    from agentrl.learner import ValueModel
    from agentrl.learner import forward as forward_module

    packed_calls = []

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        packed_calls.append(kwargs["packing"].rows)
        return packed_logprobs(*args, **kwargs)

    monkeypatch.setattr(forward_module, "packed_logprobs", counting)
    data = _shared_prompt_groups(base_model) if share else groups
    results = []
    for packing in (False, True):
        cfg = make_cfg(
            algorithm=alg,
            learner={"micro_batch_size": 4, "packing": packing, "share_prompt": share},
        )
        torch.manual_seed(0)
        model = fresh_model()
        critic = ValueModel.from_policy(model) if alg.get("critic") else None
        learner = Learner(model, None, resolve(cfg).learner, critic=critic)
        before = torch.cat([p.detach().flatten().clone() for p in learner.model.parameters()])
        metrics, grads, lp = _step_and_grads(learner, data)
        after = torch.cat([p.detach().flatten() for p in learner.model.parameters()])
        assert metrics["nonfinite_skipped"] == 0 and not torch.equal(before, after)
        results.append((metrics, grads, lp))
    (m_pad, g_pad, lp_pad), (m_pack, g_pack, lp_pack) = results
    # every micro-batch of 4 rows with padding went packed, as one row (share: none)
    if share:
        assert packed_calls == []
    else:
        assert packed_calls and set(packed_calls) == {1}
    torch.testing.assert_close(lp_pack, lp_pad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(g_pack, g_pad, atol=1e-4, rtol=1e-4)
    for key in ("loss/total", "grad_norm", "logprob_gap/mean"):
        assert m_pack[key] == pytest.approx(m_pad[key], rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize(
    ("packing", "share", "alg"),
    [
        (False, False, {"off_policy": "tis"}),
        (True, False, {"advantage": "gae", "critic": True}),
        (False, True, {"off_policy": "tis"}),
    ],
    ids=["padded", "packed-critic", "share-prompt"],
)
def test_gradient_checkpointing_gives_the_same_gradients(
    packing: bool,
    share: bool,
    alg: dict,
    fresh_model: Callable[[], torch.nn.Module],
    base_model: torch.nn.Module,
) -> None:
    """``model.gradient_checkpointing`` is on in the policy (and a separate critic) and
    changes memory, not values. With shared prompts it forwards the rows whole: the
    prefix's KV cache does not survive checkpointing."""
    from agentrl.learner import ValueModel

    data = _shared_prompt_groups(base_model)
    results = []
    for ckpt in (False, True):
        cfg = make_cfg(
            algorithm=alg,
            model={"gradient_checkpointing": ckpt},
            learner={"micro_batch_size": 4, "packing": packing, "share_prompt": share},
        )
        torch.manual_seed(0)
        model = fresh_model()
        critic = ValueModel.from_policy(model) if alg.get("critic") else None
        learner = Learner(model, None, resolve(cfg).learner, critic=critic)
        learner.model.train()
        assert checkpointing_active(learner.model) == ckpt
        if learner.critic is not None:
            learner.critic.train()
            assert checkpointing_active(learner.critic.backbone) == ckpt
        results.append(_step_and_grads(learner, data))
    (m_off, g_off, _), (m_on, g_on, _) = results
    torch.testing.assert_close(g_on, g_off, atol=1e-5, rtol=1e-4)
    assert m_on["loss/total"] == pytest.approx(m_off["loss/total"], rel=1e-5, abs=1e-7)
    assert m_on["grad_norm"] == pytest.approx(m_off["grad_norm"], rel=1e-5)
