"""reward.process: a Python function scores every assistant turn; the learner sees it."""

from __future__ import annotations

import anyio
import pytest

from agentrl.config import config_from_dict
from agentrl.errors import ConfigError
from agentrl.rewards.pipeline import RewardPipeline
from agentrl.types import Batch, Segment, Trajectory, TrajectoryGroup, Turn


def _traj() -> Trajectory:
    segs = [Segment("prompt", [1, 2])]
    for k in range(3):
        segs.append(Segment("model", [10 + k, 20 + k], logprobs=[-1.0] * 2, versions=[0] * 2))
        segs.append(Segment("observation", [3]))
    texts = ["go right", "go up", "right again"]
    turns = [Turn(index=k, text=texts[k]) for k in range(3)]
    turns[1].step_reward = 0.5  # the environment's own process reward on turn 1
    return Trajectory(segments=segs[:-1], turns=turns, reward=1.0, traj_id="a")


def test_process_functions_score_each_turn_and_reach_the_batch():
    cfg = config_from_dict(
        {"reward": {"process": [{"fn": "tests.rewards.user_rewards:says_right", "weight": 0.2}]}}
    )
    assert cfg.reward.enabled
    RewardPipeline.check(cfg)
    pipeline = RewardPipeline.from_config(cfg)
    traj = _traj()
    anyio.run(pipeline.apply, {"id": "t"}, [{"role": "assistant", "content": "x"}], traj)
    assert [t.process_reward for t in traj.turns] == pytest.approx([0.2, 0.0, 0.2])
    assert traj.reward_info["process_rewards"] == {"says_right": [1.0, 0.0, 1.0]}
    assert traj.process_rewards == pytest.approx([0.2, 0.5, 0.2])
    batch = Batch.from_groups([TrajectoryGroup("t", [traj])])
    assert batch.turn_rewards[0].tolist() == pytest.approx([0.2, 0.5, 0.2])
    again = Trajectory.from_json(traj.to_json())
    assert again.process_rewards == pytest.approx(traj.process_rewards)


def test_a_bad_process_function_fails_at_check():
    cfg = config_from_dict({"reward": {"process": ["tests.rewards.user_rewards:nope"]}})
    with pytest.raises(Exception, match="nope"):
        RewardPipeline.check(cfg)
    with pytest.raises(ConfigError):
        RewardPipeline.check(
            config_from_dict({"reward": {"process": ["tests.rewards.user_rewards:CALLS"]}})
        )
