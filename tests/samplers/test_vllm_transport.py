"""Which transport the vllm sampler's weights take (agentrl.samplers.vllm_transfer); runs
without vLLM: the choice is plain logic, the sends need a GPU."""

from __future__ import annotations

import pytest

from agentrl.samplers.vllm_transfer import pick_transport


@pytest.mark.parametrize(
    ("requested", "cuda", "learner_device", "workers", "expected"),
    [
        ("auto", False, None, 1, "shm"),  # CPU: safetensors files in /dev/shm
        ("auto", True, None, 1, "ipc"),  # colocated: NCCL refuses two ranks on one GPU
        ("auto", True, "cuda", 1, "ipc"),
        ("auto", True, "cuda:0", 1, "ipc"),
        ("auto", True, "cuda:1", 1, "nccl"),  # the learner on another GPU
        ("auto", True, None, 2, "nccl"),  # tensor parallel: workers on several GPUs
        ("nccl", True, None, 1, "nccl"),  # what the user asks for is kept
        ("shm", True, "cuda:1", 1, "shm"),
    ],
)
def test_auto_picks_ipc_when_colocated_and_nccl_across_gpus(
    requested, cuda, learner_device, workers, expected
):
    got = pick_transport(requested, cuda=cuda, learner_device=learner_device, workers=workers)
    assert got == expected


def test_an_unknown_transport_names_the_choices():
    with pytest.raises(
        ValueError, match=r"weight_transport must be one of auto, shm, nccl, ipc \(got 'rdma'\)"
    ):
        pick_transport("rdma", cuda=True, learner_device=None, workers=1)
