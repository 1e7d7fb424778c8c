"""Every option of the vllm and openai backends is used or refused with a message (run in
.venv-vllm: `make test-vllm`; nothing here starts an engine)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="needs .venv-vllm (make test-vllm)")

from agentrl.errors import ConfigError  # noqa: E402
from agentrl.samplers import create_sampler  # noqa: E402
from agentrl.samplers.vllm import VLLMSampler  # noqa: E402
from agentrl.samplers.vllm_worker import WORKER_EXTENSION  # noqa: E402
from tests.samplers.vllm_train import save_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


def test_engine_kwargs_are_vllm_fields(model_dir):
    with pytest.raises(
        ConfigError,
        match=r"engine_kwargs.enable_prefix_cachng is not a vllm.AsyncEngineArgs field.*did you mean 'enable_prefix_caching'",
    ):
        VLLMSampler(model_dir, engine_kwargs={"enable_prefix_cachng": True})
    sampler = VLLMSampler(model_dir, engine_kwargs={"enable_prefix_caching": False, "seed": 3})
    args = sampler.engine_args()
    assert args.seed == 3 and args.worker_extension_cls == WORKER_EXTENSION


@pytest.mark.parametrize(
    ("key", "instead"),
    [
        ("max_num_seqs", "max_batch_size"),
        ("dtype", "model.dtype"),
        ("logprobs_mode", "our log-prob definition"),
        ("worker_extension_cls", "vllm_worker"),
    ],
)
def test_engine_kwargs_the_sampler_sets_are_refused(model_dir, key, instead):
    with pytest.raises(
        ConfigError, match=f"engine_kwargs.{key} is set by the vllm sampler.*{instead}"
    ):
        VLLMSampler(model_dir, engine_kwargs={key: 1})


@pytest.mark.parametrize("backend", ["vllm", "openai"])
def test_unknown_options_are_refused(model_dir, backend):
    extra = {"base_url": "http://127.0.0.1:9"} if backend == "openai" else {}
    with pytest.raises(
        TypeError, match=r"unknown option 'max_batch' for the .* sampler.*did you mean"
    ):
        create_sampler(backend, model=str(model_dir), max_batch=4, **extra)


def test_gpu_memory_fraction_reaches_vllm_as_gpu_memory_utilization(model_dir):
    # vLLM's default takes 90% of the GPU, leaving a colocated learner nothing
    assert (
        VLLMSampler(model_dir, gpu_memory_fraction=0.35).engine_args().gpu_memory_utilization
        == 0.35
    )
    with pytest.raises(
        ConfigError, match=r"engine_kwargs.gpu_memory_utilization is set by.*gpu_memory_fraction"
    ):
        VLLMSampler(model_dir, engine_kwargs={"gpu_memory_utilization": 0.5})
    with pytest.raises(ValueError, match=r"gpu_memory_fraction must be in \(0, 1\]"):
        VLLMSampler(model_dir, gpu_memory_fraction=1.5)


def test_a_cuda_transport_is_what_the_engine_is_configured_for(model_dir):
    args = VLLMSampler(model_dir, weight_transport="ipc").engine_args()
    assert args.weight_transfer_config.backend == "ipc"
    assert (
        VLLMSampler(model_dir, weight_transport="shm").engine_args().weight_transfer_config is None
    )


def test_on_update_keep_is_refused_with_the_reason(model_dir):
    with pytest.raises(
        ValueError, match=r"on_update='keep' is not possible with vLLM: vLLM preempts"
    ):
        VLLMSampler(model_dir, on_update="keep")
    assert VLLMSampler(model_dir, on_update="drain").on_update == "drain"
