"""RAFT / RAFT++ in the learner: rejected rows leave the loss, RAFT's loss is the mean NLL
of the kept samples' tokens, RAFT++'s the clipped ratio on them; selected from YAML."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

from agentrl.config import load_config
from agentrl.learner import Learner
from agentrl.learner.objective import check_algorithm
from agentrl.run.settings import objective_settings, resolve
from agentrl.types import TrajectoryGroup
from tests.learner.conftest import make_cfg


def _kept_tokens(learner: Learner, groups: list[TrajectoryGroup]) -> torch.Tensor:
    lp = learner.compute_logprobs(groups)
    rows, row = [], 0
    for group in groups:
        for traj in group.trajectories:
            if traj.reward > 0:  # 0/1 rewards: the best of each group are its 1s
                rows.append(lp[row, : traj.num_tokens][torch.tensor(traj.loss_mask, dtype=bool)])
            row += 1
    return torch.cat(rows)


@pytest.mark.parametrize("loss", ["reinforce", "ppo"])
def test_the_learner_trains_on_the_kept_samples_only(
    loss: str, fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> None:
    cfg = make_cfg(algorithm={"advantage": "raft", "policy_loss": loss})
    learner = Learner(fresh_model(), None, resolve(cfg).learner)
    kept = _kept_tokens(learner, groups)
    m = learner.step(groups)
    assert m["tokens/trained"] == len(kept)  # the rejected rows left the loss mask
    if loss == "reinforce":  # RAFT: the mean NLL of the kept tokens
        assert m["loss/pg"] == pytest.approx(float(-kept.mean()), rel=1e-4)
    else:  # RAFT++: -min(r, clip(r)) with r = 1 on-policy
        assert m["loss/pg"] == pytest.approx(-1.0, abs=1e-4)


def test_raft_from_yaml_and_a_batch_with_nothing_kept(
    tmp_path, fresh_model: Callable[[], torch.nn.Module], groups: list[TrajectoryGroup]
) -> None:
    path = tmp_path / "raft.yaml"
    path.write_text(
        "algorithm:\n  advantage: raft\n  policy_loss: reinforce\n  options: {min_reward: 0.5}\n"
    )
    obj = check_algorithm(objective_settings(load_config(path)))
    assert obj.advantage_options == {"min_reward": 0.5} and obj.loss_options == {}
    cfg = make_cfg(algorithm={"advantage": "raft", "policy_loss": "reinforce"})
    model = fresh_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    learner = Learner(model, None, resolve(cfg).learner)
    failed = copy.deepcopy(groups)  # the fixture is shared
    for g in failed:  # all fail: no group has a sample to keep
        for t in g.trajectories:
            t.reward = 0.0
    m = learner.step(failed)
    assert m["tokens/trained"] == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
