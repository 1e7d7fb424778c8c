"""reward.functions: plain Python rewards on a user's dataset, end to end on the tiny model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import anyio
import pytest

from agentrl.config import load_config
from agentrl.errors import ConfigError, PluginError, RewardError
from agentrl.rewards import RewardFunction, check_reward
from agentrl.rollout.sinks import read_groups
from agentrl.run.orchestrator import Orchestrator
from agentrl.run.plotting import read_steps
from agentrl.run.runtime import assemble

FNS = "tests.rewards.user_rewards"
TINY = [
    "model.name=tiny-llama",
    "model.dtype=float32",
    "sampler.max_new_tokens=4",
    "sampler.max_batch_size=16",
    "rollout.group_size=4",
    "rollout.concurrency=16",
    "rollout.max_turns=1",
    "rollout.max_tokens=64",
    "learner.batch_groups=2",
    "learner.micro_batch_size=8",
    "learner.lr=1e-3",
    "orchestrator.checkpoint_every=0",
    "logging.progress=false",
    "learner.fused_logprobs=off",
    "orchestrator.learner_worker=thread",
]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "tasks.jsonl"
    rows = [{"problem": f"What is {i} + 1?", "solution": i + 1, "level": i % 3} for i in range(32)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cfg(data: Path, *overrides: str):
    over = [*TINY, f"data.path={data}", "data.prompt=problem", "data.answer=solution"]
    return load_config(overrides=[*over, *overrides])


def _rollout(cfg) -> list:
    run = assemble(cfg, "rollout")

    async def main() -> list:
        async with run:
            return await run.engine.collect(1)

    return anyio.run(main)[0].trajectories


def test_two_functions_weighted_train_with_grpo(data: Path, tmp_path: Path) -> None:
    cfg = _cfg(
        data,
        f"reward.functions=[{FNS}:first_token_even, {FNS}:mentions_answer]",
        "reward.weights=[1.0, 0.5]",
        "orchestrator.max_steps=2",
        "orchestrator.max_staleness=0",
    )
    orch = Orchestrator(cfg, tmp_path / "run")
    orch.build()
    anyio.run(orch.run)
    steps = read_steps(tmp_path / "run")
    assert [s["step"] for s in steps] == [1, 2]
    trajs = [t for g in read_groups(tmp_path / "run") for t in g.trajectories]
    for t in trajs:
        parts = t.reward_info["rewards"]
        assert set(parts) == {"env", "first_token_even", "mentions_answer"}
        assert t.reward == pytest.approx(parts["first_token_even"] + 0.5 * parts["mentions_answer"])
        assert t.reward_info["first_token_even/level"] in (0, 1, 2)  # the task's columns
    assert {t.reward_info["rewards"]["first_token_even"] for t in trajs} == {0.0, 1.0}


def test_async_function_gets_the_trajectory(data: Path) -> None:
    trajs = _rollout(_cfg(data, f"reward.functions=[{FNS}:short]"))
    for t in trajs:
        assert t.reward == (1.0 if t.num_model_tokens <= 3 else 0.0)


def test_a_raising_function_is_an_infra_error_of_that_episode(data: Path) -> None:
    trajs = _rollout(_cfg(data, f"reward.functions=[{FNS}:raises]", "rollout.infra_retries=1"))
    assert [t.status for t in trajs] == ["infra_error"] * 4
    assert "raises raised RuntimeError: checker service down" in trajs[0].error
    assert trajs[0].metadata["attempts"] == 2  # retried, then masked


@pytest.mark.parametrize(
    ("fn", "match"),
    [
        ("returns_str", r"returns_str returned 'yes' \(str\) \(task 'train-\d+'\): return a float"),
        ("returns_nan", r"returns_nan returned nan .*must be finite"),
    ],
)
def test_a_non_number_stops_the_run(data: Path, fn: str, match: str) -> None:
    with pytest.raises(Exception) as info:
        _rollout(_cfg(data, f"reward.functions=[{FNS}:{fn}]"))
    from agentrl.errors import user_error

    error = user_error(info.value)
    assert isinstance(error, RewardError)
    assert re.search(match, str(error))


def test_bad_functions_fail_before_any_model_loads(data: Path) -> None:
    cases = [
        (f"reward.functions=[{FNS}:needs_four]", ConfigError, "takes 4 parameters"),
        (f"reward.functions=[{FNS}:mentions_anser]", PluginError, "did you mean 'mentions_answer'"),
        (f"reward.functions=[{FNS}:CALLS]", ConfigError, "is list, not a function"),
    ]
    for override, error, match in cases:
        with pytest.raises(error, match=match):
            assemble(_cfg(data, override), "rollout")
    with pytest.raises(ConfigError, match=r"reward\.weights has 1 entries for 2 reward\.functions"):
        _cfg(data, f"reward.functions=[{FNS}:short, {FNS}:raises]", "reward.weights=[1]")


def test_check_reward_accepts_numbers_and_info() -> None:
    import numpy as np
    import torch

    task = {"id": "t"}
    assert check_reward(True, "f", task) == (1.0, {})
    assert check_reward(np.float32(0.5), "f", task) == (0.5, {})
    assert check_reward(torch.tensor(2.0), "f", task) == (2.0, {})
    assert check_reward((0.25, {"why": "x"}), "f", task) == (0.25, {"why": "x"})
    for bad in (None, "1", [1.0], float("inf")):
        with pytest.raises(RewardError, match="'t'"):
            check_reward(bad, "f", task)
    assert RewardFunction.load(lambda task: 1.0).n_args == 1
