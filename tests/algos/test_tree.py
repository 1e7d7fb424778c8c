import pytest
import torch

from agentrl.algos import policy_loss, tree_advantages, tree_from_ids, tree_owner

# Hand-built tree, T = 10 (positions 0-2 prompt, 6 an observation token, rest model):
#
#   row 0 (root)       ──────────────────────────  A = 1
#     ├─ row 1  branches from row 0 at 5 ────────  A = 2
#     │    └─ row 2  branches from row 1 at 7 ───  A = 3
#     └─ row 3  branches from row 0 at 5 ──────  A = 4   (length 8: positions 8, 9 padding)
#   row 4 (another root)                         A = 5
PARENT = torch.tensor([-1, 0, 1, 0, -1])
BRANCH_POS = torch.tensor([0, 5, 7, 5, 0])
ADV = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])


def _mask():
    m = torch.ones(5, 10)
    m[:, :3] = 0
    m[:, 6] = 0
    m[3, 8:] = 0
    return m


def _input_ids():
    ids = torch.arange(50).reshape(5, 10) + 100
    ids[1, :5] = ids[0, :5]
    ids[3, :5] = ids[0, :5]
    ids[2, :7] = ids[1, :7]
    return ids


def test_owner_climbs_to_the_topmost_row_holding_the_token():
    owner = tree_owner(PARENT, BRANCH_POS, 10)
    assert owner[2].tolist() == [0] * 5 + [1] * 2 + [2] * 3
    assert owner[1].tolist() == [0] * 5 + [1] * 5
    assert owner[3].tolist() == [0] * 5 + [3] * 5
    assert owner[0].tolist() == [0] * 10 and owner[4].tolist() == [4] * 10


def test_soft_trains_every_row_with_its_own_advantage():
    mask = _mask()
    adv, new_mask = tree_advantages("soft", ADV, PARENT, BRANCH_POS, mask, input_ids=_input_ids())
    torch.testing.assert_close(adv, ADV[:, None] * mask)
    torch.testing.assert_close(new_mask, mask)


def test_hard_trains_each_shared_token_once_with_the_mean_advantage():
    mask = _mask()
    adv, new_mask = tree_advantages("hard", ADV, PARENT, BRANCH_POS, mask, input_ids=_input_ids())
    expected_adv = torch.zeros(5, 10)
    expected_adv[:, 3:5] = (1 + 2 + 3 + 4) / 4  # shared by rows 0-3
    expected_adv[1:3, 5] = (2 + 3) / 2  # shared by rows 1 and 2 (position 6 is observation)
    expected_adv[0, 5:] = 1.0
    expected_adv[1, 7:] = 2.0
    expected_adv[2, 7:] = 3.0
    expected_adv[3, 5:8] = 4.0
    expected_adv[4, 3:] = 5.0
    expected_adv[:, 6] = 0.0
    torch.testing.assert_close(adv, expected_adv)

    expected_mask = mask.clone()
    expected_mask[1:4, 3:5] = 0  # kept in row 0 only
    expected_mask[2, 5] = 0  # kept in row 1
    torch.testing.assert_close(new_mask, expected_mask)
    # every distinct trained token counted once: 5 rows' own tokens + shared ones
    assert int(new_mask.sum()) == 2 + 1 + (4 + 3 + 3 + 2 + 6)

    # token-mean over the hard mask: a linear loss sees each distinct token once
    lp = torch.zeros(5, 10, requires_grad=True)
    loss, _ = policy_loss("ppo", lp, lp.detach(), adv, new_mask)
    loss.backward()
    torch.testing.assert_close(lp.grad, -expected_adv * expected_mask / expected_mask.sum())


def test_hard_skips_rows_that_do_not_train_the_token():
    mask = _mask()
    mask[0] = 0  # the root is an infra error: its shared prefix is trained by row 1
    adv, new_mask = tree_advantages("hard", ADV, PARENT, BRANCH_POS, mask)
    assert adv[1, 3] == pytest.approx((2 + 3 + 4) / 3)
    assert new_mask[:, 3].tolist() == [0, 1, 0, 0, 1]


def test_hard_with_token_level_advantages_averages_per_token():
    mask = _mask()
    adv_tok = ADV[:, None] * torch.linspace(1, 2, 10)
    adv, _ = tree_advantages("hard", adv_tok, PARENT, BRANCH_POS, mask)
    assert adv[0, 4] == pytest.approx(float(adv_tok[:4, 4].mean()))


def test_without_branches_hard_equals_soft():
    mask = _mask()
    roots = torch.full((5,), -1)
    soft = tree_advantages("soft", ADV, roots, BRANCH_POS, mask)
    hard = tree_advantages("hard", ADV, roots, BRANCH_POS, mask)
    torch.testing.assert_close(soft.advantages, hard.advantages)
    torch.testing.assert_close(soft.loss_mask, hard.loss_mask)


def test_bad_trees_are_rejected_with_the_row():
    mask = _mask()
    ids = _input_ids()
    ids[2, 6] = 0  # row 2 claims position 6 from row 1 but holds another token
    with pytest.raises(ValueError, match="row 2 claims token 6"):
        tree_advantages("hard", ADV, PARENT, BRANCH_POS, mask, input_ids=ids)
    with pytest.raises(ValueError, match="cycle"):
        tree_owner(torch.tensor([1, 0]), torch.tensor([3, 3]), 5)
    with pytest.raises(ValueError, match=r"parent\[1\]"):
        tree_owner(torch.tensor([-1, 7]), torch.tensor([0, 3]), 5)
    with pytest.raises(ValueError, match=r"branch_pos\[1\]"):
        tree_owner(torch.tensor([-1, 0]), torch.tensor([0, 9]), 5)


def test_tree_from_ids():
    parent, pos = tree_from_ids(["a", "b", "c", "d"], [None, "a", "b", "gone"], [None, 5, 7, 3])
    assert parent.tolist() == [-1, 0, 1, -1]
    assert pos.tolist() == [0, 5, 7, 0]
