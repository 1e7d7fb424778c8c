"""End-to-end runs on the tiny model with issue 20's algorithm keys: REINFORCE++ with the
KL in the reward; decoupled PPO with loglinear proximal log-probs and IcePop's token mask;
DAPO's overlong filter."""

from __future__ import annotations

import pytest

from agentrl.run.plotting import read_steps
from tests.orchestrator.test_train import _run, _weights_changed


@pytest.mark.parametrize(
    "algo",
    [
        [
            "algorithm.advantage=reinforce_pp",
            "algorithm.kl=k3",
            "algorithm.kl_coef=0.05",
            "algorithm.kl_in_reward=true",
        ],
        [
            "algorithm.advantage=grpo",
            "algorithm.off_policy=decoupled",
            "algorithm.proximal=loglinear",
            "algorithm.is_mask=token",
            "algorithm.is_mask_low=0.5",
            "algorithm.is_mask_high=5.0",
        ],
    ],
    ids=["reinforce_pp_kl_in_reward", "decoupled_loglinear_icepop"],
)
def test_corrections_train(tmp_path, algo):
    # a learner thread: the process path has its own tests (test_train.py, tests/faults)
    orch = _run(
        tmp_path,
        "orchestrator.max_steps=2",
        "orchestrator.max_staleness=1",
        "orchestrator.learner_worker=thread",
        *algo,
    )
    steps = read_steps(tmp_path / "run")
    assert [s["step"] for s in steps] == [1, 2]
    assert orch.learner.version == 2
    for s in steps:
        assert s["loss/total"] == s["loss/total"]  # finite
    if "algorithm.kl_in_reward=true" in algo:
        assert all("kl_reward_mean" in s and "loss/kl" not in s for s in steps)
    else:
        assert all("pg/is_rejected_frac" in s for s in steps)
    assert _weights_changed(orch)


def test_overlong_filter_end_to_end(tmp_path):
    """With sampler.max_new_tokens=4 the tiny model's answers are all cut at the length
    limit: the filter takes every one out of the loss, and the weights stay put."""
    orch = _run(
        tmp_path, "orchestrator.max_steps=1", "orchestrator.max_staleness=0",
        "algorithm.overlong.filter=true",
    )  # fmt: skip
    (step,) = read_steps(tmp_path / "run")
    assert step["overlong_filtered"] == 8  # learner.batch_groups=2 x rollout.group_size=4
    assert step["tokens/trained"] == 0
    assert not _weights_changed(orch)


def test_synchronous_tis_run_bypasses_the_start_of_step_pass(tmp_path):
    """Sampler and learner in float32, one update per step, max_staleness 0: every step
    uses the behaviour log-probs as pi_old, and the sampler-vs-learner gap stays logged."""
    _run(
        tmp_path, "orchestrator.max_steps=2", "orchestrator.max_staleness=0",
        "algorithm.off_policy=tis", "learner.bf16=off",
    )  # fmt: skip
    steps = read_steps(tmp_path / "run")
    assert [s["learner/proximal_bypass"] for s in steps] == [1.0, 1.0], steps
    assert all(s["pg/is_weight_mean"] == 1.0 for s in steps), steps
    gaps = [s["logprob_gap/mean"] for s in steps]
    assert all(0 <= g < 1e-3 for g in gaps), gaps  # same numerics, fresh tokens
