"""Placement settings resolved on a machine without CUDA: auto is the CPU, an explicit CUDA
device is a ConfigError naming the key and the fix; memory budgets checked per role."""

from __future__ import annotations

import pytest
import torch

from agentrl.config import config_from_dict
from agentrl.devices import (
    GiB,
    budget_error,
    check_budgets,
    check_memory,
    fits,
    learner_bytes,
    resolve_device,
)
from agentrl.errors import ConfigError
from agentrl.learner.precision import Precision
from agentrl.run.components import build_sampler
from agentrl.run.settings import resolve

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answers")


@no_cuda
def test_auto_is_the_cpu_without_cuda():
    assert resolve_device("auto", "sampler.device") == torch.device("cpu")
    cfg = config_from_dict({})
    cpu = torch.device("cpu")
    assert resolve(cfg).budgets == {"learner": (cpu, None), "sampler": (cpu, None)}
    assert Precision.from_settings(resolve(cfg).learner.train).device == torch.device("cpu")


@no_cuda
@pytest.mark.parametrize("key", ["sampler.device", "learner.device"])
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_an_explicit_cuda_device_without_cuda_names_the_key_and_the_fix(key, name):
    section, field = key.split(".")
    cfg = config_from_dict({section: {field: name}})
    with pytest.raises(ConfigError, match=rf"{key}='{name}'.*no usable CUDA.*{key}=auto"):
        resolve(cfg)


@no_cuda
def test_the_hf_sampler_and_the_learner_refuse_a_missing_gpu():
    cfg = config_from_dict({"model": {"name": "tiny-llama"}, "sampler": {"device": "cuda"}})
    with pytest.raises(ConfigError, match=r"sampler\.device"):
        build_sampler(resolve(cfg).sampler)
    with pytest.raises(ConfigError, match=r"learner\.device"):
        resolve(config_from_dict({"learner": {"device": "cuda:0"}}))


def test_a_device_that_is_not_one_is_refused():
    with pytest.raises(ConfigError, match=r"learner.device='gpu0' is not a device"):
        resolve_device("gpu0", "learner.device")
    with pytest.raises(ConfigError, match="only cpu and cuda"):
        resolve_device("meta", "sampler.device")


def test_budgets_are_ignored_on_the_cpu():
    cfg = config_from_dict({"learner": {"gpu_memory_fraction": 0.01}})
    check_memory(
        cfg.learner.gpu_memory_fraction, "learner", 10**15, torch.device("cpu"), "everything"
    )  # no error


def test_learner_memory_counts_adam_state_for_trained_parameters_only():
    full = learner_bytes(1_000_000, 1_000_000)
    lora = learner_bytes(1_000_000, 10_000)
    assert full == 16_000_000
    assert lora == 10_000 * 16 + 990_000 * 4
    assert learner_bytes(1_000_000, 1_000_000, reference=True) == full + 4_000_000


def test_a_budget_that_does_not_fit_says_what_and_how_to_fix_it():
    total = 80 * GiB
    need = learner_bytes(1_500_000_000, 1_500_000_000)  # 1.5B full fine-tune: ~22 GiB
    assert not fits(need, 0.25, total) and fits(need, 0.5, total)
    err = budget_error("learner", 0.25, need, total, torch.device("cuda", 0), "weights")
    text = str(err)
    assert "learner.gpu_memory_fraction=0.25" in text and "22.35 GiB" in text
    assert "20.00 GiB of 80.00 GiB" in text and "model.lora" in text


def test_budgets_on_one_gpu_must_add_up_to_at_most_one():
    # the sum check runs when the settings are resolved, before any model loads
    gpu, other = torch.device("cuda", 0), torch.device("cuda", 1)
    check_budgets({"sampler": (gpu, 0.3), "learner": (gpu, 0.7)})
    check_budgets({"sampler": (gpu, 0.5), "learner": (other, 0.7)})  # two GPUs
    check_budgets({"sampler": (gpu, None), "learner": (gpu, 0.7)})  # no budget: no sum
    with pytest.raises(ConfigError, match=r"= 1\.2 > 1 on cuda:0.*learner\.device=cuda:1"):
        check_budgets({"sampler": (gpu, 0.5), "learner": (gpu, 0.7)})


@no_cuda
def test_an_eval_or_rollout_run_does_not_resolve_the_learner_device():
    from agentrl.devices import limit_process_memory

    cfg = config_from_dict({"learner": {"device": "cuda:3"}})
    settings = resolve(cfg, "eval")  # no error: this run has no learner
    limit_process_memory(settings.budgets_of(["sampler", "learner"]))  # CPU: nothing to cap
    with pytest.raises(ConfigError, match=r"learner\.device"):
        resolve(cfg)


def test_the_sampler_budget_counts_weights_and_a_full_kv_cache():
    from agentrl.devices import kv_cache_bytes, sampler_bytes
    from agentrl.models import tiny_llama

    model = tiny_llama(0)  # 2 layers, 4 heads of 16, float32: 2 x 2 x 4 x 16 x 4 B a token
    assert kv_cache_bytes(model.config, rows=32, tokens=1024, element_size=4) == 32 * 2**20
    need, what = sampler_bytes(model, rows=32, tokens=1024)
    weights = sum(p.numel() * 4 for p in model.parameters())
    assert need == weights + 32 * 2**20
    assert "KV cache of 32 sequences x 1024 tokens 0.03 GiB" in what
