import json

import pytest
import torch

from agentrl.types import (
    NO_VERSION,
    Batch,
    Segment,
    ToolCallRecord,
    Trajectory,
    TrajectoryGroup,
    Turn,
)


def _traj(reward: float = 1.0, status: str = "ok") -> Trajectory:
    return Trajectory(
        segments=[
            Segment("prompt", [1, 2, 3]),
            Segment("model", [4, 5], logprobs=[-0.1, -0.2], versions=[3, 3], entropies=[0.5, 0.4]),
            Segment("observation", [6, 7, 8]),
            Segment("model", [9], logprobs=[-0.3], versions=[4]),
        ],
        turns=[
            Turn(index=0, generated_tokens=2, tool_calls=[ToolCallRecord("python", {"code": "1"})])
        ],
        reward=reward,
        status=status,  # type: ignore[arg-type]
        task_id="t0",
        traj_id="a",
    )


def test_derived_views_are_aligned():
    t = _traj()
    assert t.input_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert t.loss_mask == [0, 0, 0, 1, 1, 0, 0, 0, 1]
    assert t.behavior_logprobs == [0, 0, 0, -0.1, -0.2, 0, 0, 0, -0.3]
    assert t.versions == [NO_VERSION] * 3 + [3, 3] + [NO_VERSION] * 3 + [4]
    assert t.prompt_length == 3 and t.response_length == 6 and t.num_model_tokens == 3
    assert t.oldest_version == 3 and t.num_tool_calls == 1


def test_json_round_trip():
    g = TrajectoryGroup(
        "t0", [_traj(1.0), _traj(0.0, "infra_error")], task={"q": "x"}, group_id="g"
    )
    line = g.to_json()
    json.loads(line)
    back = TrajectoryGroup.from_json(line)
    assert back.to_dict() == g.to_dict()
    assert back.trajectories[0].turns[0].tool_calls[0].name == "python"


def test_model_segment_needs_logprobs_and_versions():
    with pytest.raises(ValueError, match="logprobs and versions"):
        Segment("model", [1, 2])
    with pytest.raises(ValueError, match="lengths differ"):
        Segment("model", [1, 2], logprobs=[0.0], versions=[0, 0])
    with pytest.raises(ValueError, match="kind"):
        Segment("assistant", [1])  # type: ignore[arg-type]


def test_batch_pads_and_masks_infra_errors():
    short = Trajectory(
        segments=[Segment("prompt", [1]), Segment("model", [2], logprobs=[-1.0], versions=[0])]
    )
    g = TrajectoryGroup("t", [_traj(1.0), short, _traj(0.5, "infra_error")])
    b = Batch.from_groups([g], pad_token_id=0)
    assert b.input_ids.shape == (3, 9)
    assert b.attention_mask[1].tolist() == [1, 1] + [0] * 7
    assert b.loss_mask[1].tolist() == [0, 1] + [0] * 7
    assert b.loss_mask[2].sum() == 0  # infra_error rows leave the loss
    assert b.valid.tolist() == [1.0, 1.0, 0.0]
    assert torch.equal(b.group_index, torch.tensor([0, 0, 0]))
    assert b.behavior_logprobs[0, 3].item() == pytest.approx(-0.1)
    assert b.versions[1, 0].item() == NO_VERSION


def test_batch_rejects_empty():
    with pytest.raises(ValueError):
        Batch.from_groups([])
