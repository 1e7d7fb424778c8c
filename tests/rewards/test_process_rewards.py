"""reward.process: a Python function scores every assistant turn; the learner sees it."""

from __future__ import annotations

import anyio
import pytest

from agentrl.config import config_from_dict
from agentrl.errors import ConfigError
from agentrl.rewards.pipeline import RewardPipeline
from agentrl.run.settings import resolve
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
    RewardPipeline.check(resolve(cfg).reward)
    pipeline = RewardPipeline.from_settings(resolve(cfg).reward)
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
        RewardPipeline.check(resolve(cfg).reward)
    with pytest.raises(ConfigError):
        RewardPipeline.check(
            resolve(
                config_from_dict({"reward": {"process": ["tests.rewards.user_rewards:CALLS"]}})
            ).reward
        )


@pytest.fixture(scope="module")
def prm_folder(tmp_path_factory):
    """A tiny randomly initialised one-score reward model folder (what `agentrl rm train`
    writes, untrained): its scores differ from prefix to prefix, which is all we need."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from agentrl.rewards.bradley_terry import base_model_folder

    root = tmp_path_factory.mktemp("prm")
    base = base_model_folder("tiny-llama", root / "base")
    torch.manual_seed(0)
    rm = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1)
    rm.save_pretrained(root / "prm")
    AutoTokenizer.from_pretrained(base).save_pretrained(root / "prm")
    return root / "prm"


CONVERSATION = [
    {"role": "system", "content": "Walk to the goal."},
    {"role": "user", "content": "Your move?"},
    {"role": "assistant", "content": "go right"},
    {"role": "user", "content": "You moved right. Your move?"},
    {"role": "assistant", "content": "go up"},
    {"role": "user", "content": "You moved up. Your move?"},
    {"role": "assistant", "content": "right again"},
]


def test_a_process_reward_model_scores_the_conversation_up_to_each_turn(prm_folder):
    from agentrl.rewards.pipeline import turn_prefixes
    from agentrl.rewards.reward_model import render_for_reward

    cfg = config_from_dict(
        {
            "reward": {
                "process_model": str(prm_folder),
                "process_model_weight": 0.5,
                "model_device": "cpu",
                "process": [{"fn": "tests.rewards.user_rewards:says_right", "weight": 0.2}],
            }
        }
    )
    assert cfg.reward.enabled
    RewardPipeline.check(resolve(cfg).reward)
    pipeline = RewardPipeline.from_settings(resolve(cfg).reward)
    prm = pipeline.process_model
    traj = _traj()
    anyio.run(pipeline.apply, {"id": "t"}, CONVERSATION, traj)
    assert prm.batches == 1  # the episode's three turns in one forward pass

    prefixes = turn_prefixes(CONVERSATION, [t.text for t in traj.turns])
    assert [len(p) for p in prefixes] == [3, 5, 7]  # turn k sees assistant turns <= k only
    direct = prm.score_texts([render_for_reward(prm.tokenizer, p) for p in prefixes])
    assert len(set(direct)) == 3  # the prefixes score differently: the test can tell them apart
    assert traj.reward_info["process_rewards"]["process_model"] == pytest.approx(direct, abs=1e-5)
    says_right = [1.0, 0.0, 1.0]
    expected = [0.2 * f + 0.5 * m for f, m in zip(says_right, direct, strict=True)]
    assert [t.process_reward for t in traj.turns] == pytest.approx(expected, abs=1e-5)
    batch = Batch.from_groups([TrajectoryGroup("t", [traj])])
    env_step = [0.0, 0.5, 0.0]  # turn 1 also carries the environment's own step reward
    assert batch.turn_rewards[0].tolist() == pytest.approx(
        [e + p for e, p in zip(env_step, expected, strict=True)], abs=1e-5
    )
    anyio.run(pipeline.aclose)


def test_turn_prefixes_end_a_turn_missing_from_the_conversation_with_its_text():
    from agentrl.rewards.pipeline import turn_prefixes

    cut = CONVERSATION[:5]  # the last turn was truncated: not in the conversation
    prefixes = turn_prefixes(cut, ["go right", "go up", "right ag"])
    assert prefixes[1] == cut
    assert prefixes[2] == [*cut, {"role": "assistant", "content": "right ag"}]


def test_process_model_shares_the_reward_model_and_names_its_field(prm_folder, tmp_path):
    cfg = config_from_dict(
        {
            "reward": {
                "model": str(prm_folder),
                "process_model": str(prm_folder),
                "model_device": "cpu",
            }
        }
    )
    pipeline = RewardPipeline.from_settings(resolve(cfg).reward)
    assert pipeline.process_model is pipeline.model  # one copy of the weights
    not_rm = tmp_path / "policy"
    not_rm.mkdir()
    (not_rm / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    bad = config_from_dict({"reward": {"process_model": str(not_rm)}})
    with pytest.raises(ConfigError, match=r"^reward\.process_model .*not a reward model"):
        RewardPipeline.check(resolve(bad).reward)
