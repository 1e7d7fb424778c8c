"""benchmarks/vs_trl.py's agentrl configurations resolve to the settings their names say
(the low-precision rows must be labelled by what they ran)."""

from __future__ import annotations

import pytest

from agentrl.config import load_config
from agentrl.errors import ConfigError
from benchmarks.vs_trl import CONFIGS, agentrl_config, machine


@pytest.mark.parametrize(
    ("config", "precision", "staleness", "checkpointing"),
    [
        ("sync", "auto", 0, False),
        ("async", "auto", 1, False),
        ("sync+gc", "auto", 0, True),
        ("sync+bf16s", "bfloat16", 0, False),
        ("async+bf16s", "bfloat16", 1, False),
        ("sync+int8s", "int8", 0, False),
        ("async+int8s", "int8", 1, False),
        ("async+gc+bf16s", "bfloat16", 1, True),
    ],
)
def test_each_configuration_runs_what_its_name_says(
    config: str, precision: str, staleness: int, checkpointing: bool
) -> None:
    assert config in CONFIGS
    cfg = load_config(overrides=agentrl_config(config, "float32", 3, 1e-6, []))
    assert cfg.sampler.weight_precision == precision
    assert cfg.orchestrator.max_staleness == staleness
    assert cfg.model.gradient_checkpointing is checkpointing
    assert cfg.model.dtype == "float32"  # the learner side is the float32 row's
    assert cfg.learner.bf16 == "off"


def test_a_scoped_override_reaches_only_its_mode() -> None:
    sets = ["sync:learner.micro_batch_size=8"]
    sync = load_config(overrides=agentrl_config("sync+bf16s", "float32", 3, 1e-6, sets))
    asyn = load_config(overrides=agentrl_config("async", "float32", 3, 1e-6, sets))
    assert sync.learner.micro_batch_size == 8
    assert asyn.learner.micro_batch_size == 4


def test_a_bad_override_names_the_key() -> None:
    with pytest.raises(ConfigError, match="weight_precision"):
        load_config(
            overrides=agentrl_config("sync", "float32", 3, 1e-6, ["sampler.weight_precision=int4"])
        )


def test_the_machine_record_names_the_cpu_features() -> None:
    info = machine()
    assert info["cpus"] >= 1
    for key in ("avx2", "avx512f", "avx512_bf16"):
        assert isinstance(info.get(key, False), bool)
