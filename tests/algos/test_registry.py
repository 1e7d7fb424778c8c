import pytest
import torch

import agentrl.algos as algos
from agentrl.errors import UnknownNameError


@pytest.mark.parametrize(
    ("call", "typo", "suggestion"),
    [
        (lambda n: algos.compute_advantages(n, torch.zeros(2), torch.zeros(2)), "grpoo", "grpo"),
        (
            lambda n: algos.policy_loss(
                n, torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1), torch.ones(1, 2)
            ),
            "gspo_tokn",
            "gspo_token",
        ),
        (lambda n: algos.kl_divergence(n, torch.zeros(1, 2), torch.zeros(1, 2)), "k33", "k3"),
        (
            lambda n: algos.aggregate(n, torch.zeros(1, 2), torch.ones(1, 2)),
            "token_mean",
            "token-mean",
        ),
    ],
)
def test_unknown_names_suggest_close_ones(call, typo, suggestion):
    with pytest.raises(UnknownNameError) as exc:
        call(typo)
    msg = str(exc.value)
    assert f"'{typo}'" in msg and f"did you mean '{suggestion}'" in msg
    assert isinstance(exc.value, KeyError)  # callers may catch KeyError too


def test_builtin_names_are_registered():
    assert {"gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"} <= set(
        algos.ADVANTAGES.names()
    )
    assert {"ppo", "gspo", "gspo_token"} <= set(algos.POLICY_LOSSES.names())
    assert {"k1", "k2", "k3", "k3+"} <= set(algos.KL_ESTIMATORS.names())
    assert {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"} <= set(
        algos.AGGREGATIONS.names()
    )
    assert {"soft", "hard"} <= set(algos.TREE_ATTRIBUTIONS.names())


def test_users_register_their_own_without_editing_code():
    @algos.register_advantage("test_max_baseline")
    def max_baseline(rewards, group_ids, *, valid=None, **_):
        return rewards - rewards.max()

    @algos.register_policy_loss("test_vanilla_pg")
    def vanilla_pg(logprobs, old_logprobs, advantages, mask, *, scale=1.0):
        return -scale * advantages * logprobs, {"clip_frac": 0.0}

    @algos.register_kl("test_abs")
    def abs_kl(logprobs, ref_logprobs):
        return (logprobs - ref_logprobs).abs()

    @algos.register_aggregation("test_sum")
    def agg_sum(loss, mask, **_):
        return (loss * mask).sum()

    try:
        adv = algos.compute_advantages(
            "test_max_baseline", torch.tensor([1.0, 3.0]), torch.zeros(2)
        )
        torch.testing.assert_close(adv, torch.tensor([-2.0, 0.0]))
        lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
        loss, m = algos.policy_loss(
            "test_vanilla_pg",
            lp,
            lp.detach(),
            torch.ones(1),
            torch.ones(1, 2),
            agg="test_sum",
            scale=2.0,
        )
        assert loss.item() == pytest.approx(6.0) and "approx_kl" in m
        kl = algos.kl_divergence("test_abs", torch.zeros(1, 1), torch.ones(1, 1))
        assert float(kl) == 1.0
        with pytest.raises(ValueError, match="already registered"):
            algos.register_kl("test_abs")(lambda a, b: a)
        algos.register_kl("test_abs", override=True)(lambda a, b: a - b)
    finally:
        for reg, name in (
            (algos.ADVANTAGES, "test_max_baseline"),
            (algos.POLICY_LOSSES, "test_vanilla_pg"),
            (algos.KL_ESTIMATORS, "test_abs"),
            (algos.AGGREGATIONS, "test_sum"),
        ):
            reg._fns.pop(name, None)


def test_advantages_declare_whether_they_need_a_critic():
    @algos.register_advantage("test_critic_adv", needs_critic=True)
    def critic_adv(rewards, group_ids, *, valid=None, values, mask, gamma, lam, scale=1.0):
        adv = scale * (rewards[:, None] - values) * mask
        return adv, adv + values

    try:
        assert algos.ADVANTAGES.needs_critic("test_critic_adv")
        assert algos.ADVANTAGES.needs_critic("gae") and not algos.ADVANTAGES.needs_critic("rloo")
        with pytest.raises(UnknownNameError, match="did you mean 'gae'"):
            algos.ADVANTAGES.needs_critic("gea")
        values, mask = torch.full((2, 3), 0.5), torch.ones(2, 3)
        adv, returns = algos.estimate_advantages(
            "test_critic_adv", torch.tensor([1.0, 0.0]), torch.zeros(2), values=values,
            mask=mask, scale=2.0,
        )  # fmt: skip
        torch.testing.assert_close(adv[:, 0], torch.tensor([1.0, -1.0]))
        torch.testing.assert_close(returns, adv + values)
    finally:
        algos.ADVANTAGES._fns.pop("test_critic_adv", None)


def test_keyword_parameters_are_what_options_can_reach():
    def loss(logprobs, old_logprobs, advantages, mask, *, scale=1.0): ...

    def anything(*args, **kwargs): ...

    assert algos.keyword_parameters(loss) == (
        ["logprobs", "old_logprobs", "advantages", "mask", "scale"],
        False,
    )
    assert algos.keyword_parameters(anything) == ([], True)
    named, takes_any = algos.keyword_parameters(algos.ADVANTAGES.get("grpo"))
    assert {"eps", "norm_by_std"} <= set(named) and not takes_any


def test_estimators_declare_typed_inputs_and_get_exactly_those():
    """A declared input is a field of AdvantageInputs (a typo names the fields); the
    learner hands an estimator the fields it declared and no others, whatever its
    signature catches."""
    from agentrl.learner.objective import Objective
    from agentrl.learner.settings import AlgorithmSettings
    from agentrl.types import Batch, Segment, Trajectory, TrajectoryGroup, Turn

    with pytest.raises(ValueError, match=r"'turn_rewardz'.*declare some of: mask, gamma"):
        algos.register_advantage("test_typo_input", inputs=("turn_rewardz",))(lambda r, g: r)
    assert "test_typo_input" not in algos.ADVANTAGES.names()

    seen: dict[str, object] = {}

    @algos.register_advantage("test_declared_inputs", inputs=("turn_rewards", "turn_states"))
    def declared(rewards, group_ids, **kwargs):
        seen.update(rewards=rewards, **kwargs)
        return rewards - rewards.mean()

    assert algos.ADVANTAGES.inputs("test_declared_inputs") == ("turn_rewards", "turn_states")
    trajs = []
    for i, (outcome, step) in enumerate([(1.0, 0.5), (0.0, None)]):
        t = Trajectory(
            segments=[Segment("prompt", [1, 2]), Segment("model", [3, 4], [-1.0] * 2, [0] * 2)],
            turns=[Turn(index=0, step_reward=step, state="s0")],
            reward=outcome,
            traj_id=f"t{i}",
        )
        trajs.append(t)
    batch = Batch.from_groups([TrajectoryGroup("task", trajs)])
    objective = Objective(
        AlgorithmSettings(advantage="test_declared_inputs"), attribution="soft", norm_length=8
    )
    objective.advantages(batch, batch.rewards, None)
    assert sorted(seen) == ["rewards", "turn_rewards", "turn_states", "valid"]
    # it reads the turns itself: its rewards are the outcomes, the step reward comes apart
    assert seen["rewards"].tolist() == [1.0, 0.0]
    assert seen["turn_rewards"].tolist() == [[0.5], [0.0]]
    assert seen["turn_states"] == [["s0"], ["s0"]]
