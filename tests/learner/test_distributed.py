"""The learner on 2 ranks (gloo, CPU) against one process: DDP and FSDP2 give the same
weights after 3 steps (float32 tolerance), with global loss denominators and metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.learner.distributed_worker import CASES, train
from tests.learner.ranks import free_port, run_ranks


def two_ranks(out: Path, case: str) -> Path:
    """`case` trained by 2 ranks in one gloo group; rank 0's results in `out`."""
    address = f"tcp://127.0.0.1:{free_port()}"
    run_ranks("tests.learner.distributed_worker", 2, "2", address, str(out), case)
    return out


# FSDP2 (sharding, padding micro-batches, the split no-grad pass) in the slow tier; DDP (the
# plain gradient all-reduce) and the other cases with the integration tests: each spawns 2 ranks
@pytest.mark.parametrize(
    "case",
    [
        pytest.param("fsdp", marks=pytest.mark.slow),
        pytest.param("ddp", marks=pytest.mark.integration),
        pytest.param("fsdp_critic", marks=pytest.mark.integration),
        pytest.param("fsdp_ref_refresh", marks=pytest.mark.integration),
    ],
)
def test_two_ranks_match_one_process(tmp_path: Path, case: str) -> None:
    ranked = torch.load(two_ranks(tmp_path, case) / f"{case}.pt")
    weights, metrics = train(case, 1)
    assert set(ranked["weights"]) == set(weights)
    for name, w in weights.items():
        torch.testing.assert_close(ranked["weights"][name], w, rtol=1e-4, atol=2e-5, msg=name)
    base = tiny_llama_weights()
    moved = max(float((w - base[k]).abs().max()) for k, w in weights.items())
    assert moved > 1e-4  # the steps trained (equal weights are not both untouched)
    for one, two in zip(metrics, ranked["metrics"], strict=True):
        # loss/total is the global minibatch loss; loss/pg averages micro-batch means, which
        # depend on how rows are cut into micro-batches unless the loss is a token mean
        keys = ["loss/total", "grad_norm", "tokens/trained", "entropy"]
        if "kl" in one:
            keys.append("kl")
        if CASES[case]["algorithm"].get("agg") == "token-mean":
            keys.append("loss/pg")
        for key in keys:
            assert two[key] == pytest.approx(one[key], rel=1e-3, abs=1e-5), key


def tiny_llama_weights() -> dict[str, torch.Tensor]:
    from agentrl.models import tiny_llama

    return tiny_llama(seed=0).state_dict()


def test_rows_are_shared_by_whole_groups_and_padded_in_lockstep() -> None:
    from agentrl.learner.batching import BatchLayout
    from agentrl.learner.distributed import Ranks, rank_micro_batches, share_rows

    # 5 groups of 2 rows; group 0 long
    group_index = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
    lengths = torch.tensor([90, 80, 10, 12, 20, 22, 30, 31, 15, 16])
    layout = BatchLayout(lengths, group_index, None, micro_batch_size=2)
    rows = torch.tensor([9, 0, 3, 5, 7, 1, 2, 4, 6, 8])  # a minibatch's permutation
    shares = share_rows(layout, rows, 2)
    assert sorted(torch.cat(shares).tolist()) == list(range(10))
    for share in shares:  # whole groups, in the permutation's order
        groups = {int(group_index[r]) for r in share}
        assert all(int(group_index[r]) in groups for r in share)
        assert sorted(share.tolist()) == sorted(
            r for r in range(10) if int(group_index[r]) in groups
        )
        order = [rows.tolist().index(r) for r in share.tolist()]
        assert order == sorted(order)
    assert [int(group_index[r]) for r in shares[0]] == [0, 0]  # the long group alone
    per_rank = [list(rank_micro_batches(layout, rows, Ranks(rank, 2, "fsdp"))) for rank in range(2)]
    assert len(per_rank[0]) == len(per_rank[1]) == 4  # lockstep: rank 0 padded to 4
    assert [counts for _, counts in per_rank[0]] == [True, False, False, False]
    ddp = list(rank_micro_batches(layout, rows, Ranks(0, 2, "ddp")))
    assert len(ddp) == 1  # DDP runs only its own
