from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.errors import ConfigError

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))


def test_defaults_validate():
    cfg = load_config()
    assert cfg.orchestrator.max_staleness >= 0


def test_dotted_override_parses_yaml_scalars():
    cfg = load_config(
        overrides=["learner.lr=3e-6", "orchestrator.max_staleness=0", "env.options.size=5"]
    )
    assert cfg.learner.lr == 3e-6
    assert cfg.orchestrator.max_staleness == 0
    assert cfg.env.options == {"size": 5}


def test_bare_on_off_reach_the_literal_fields_from_set_and_from_a_file(tmp_path):
    # YAML 1.1 reads a bare off as false: every on/off-valued field takes it as "off"
    sets = [
        "algorithm.proximal_bypass=off",
        "algorithm.off_policy=tis",
        "learner.bf16=off",
        "learner.fused_logprobs=on",
    ]
    cfg = load_config(overrides=sets)
    assert cfg.algorithm.proximal_bypass == "off" and cfg.learner.bf16 == "off"
    assert cfg.learner.fused_logprobs == "on"
    path = tmp_path / "c.yaml"
    path.write_text("algorithm:\n  proximal_bypass: off\n")
    assert load_config(path).algorithm.proximal_bypass == "off"
    # a bare on is no value of proximal_bypass: the error names the field and its choices
    with pytest.raises(ConfigError, match=r"proximal_bypass.*'auto' or 'off'.*'on'"):
        load_config(overrides=["algorithm.proximal_bypass=on"])


def test_unknown_key_suggests_closest():
    with pytest.raises(ConfigError, match=r"unknown key 'learner\.lrr'.*did you mean 'lr'"):
        load_config(overrides=["learner.lrr=1"])
    with pytest.raises(ConfigError, match=r"did you mean 'orchestrator'"):
        load_config(overrides=["orchestrater.max_steps=1"])


def test_a_removed_key_in_an_old_config_names_its_replacement(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("sampler:\n  drain_on_update: true\norchestrator:\n  partial_rollouts: false\n")
    with pytest.raises(ConfigError) as e:
        load_config(old)
    msg = str(e.value)
    assert "sampler.drain_on_update was removed: use sampler.on_update: drain" in msg
    assert "orchestrator.partial_rollouts was removed: use sampler.on_update: drain" in msg
    assert "unknown key" not in msg


def test_bad_value_names_field_value_and_range():
    with pytest.raises(ConfigError) as e:
        load_config(overrides=["orchestrator.max_staleness=-1"])
    msg = str(e.value)
    assert (
        "orchestrator.max_staleness" in msg and "-1" in msg and "greater than or equal to 0" in msg
    )


def test_branching_budget_check():
    with pytest.raises(ConfigError, match="initial"):
        load_config(overrides=["rollout.branching.initial=9", "rollout.branching.budget=4"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("learner: [1, 2")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        load_config(overrides=["learner.lr"])


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_validate(path):
    load_config(path)


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("learner.bf16_matmul", "rounded", "bf16 config computes in float32"),
        ("learner.share_weights", "off", "learner.weight_sharing"),
    ],
)
def test_removed_keys_say_they_were_removed(key, value, says, tmp_path):
    """An old config fails naming the removed key and what to do instead, from YAML and
    from an override alike."""
    section, name = key.split(".")
    path = tmp_path / "old.yaml"
    path.write_text(f"{section}:\n  {name}: {value}\n")
    for load in (lambda: load_config(path), lambda: load_config(None, [f"{key}={value}"])):
        with pytest.raises(ConfigError) as err:
            load()
        assert f"{key} was removed" in str(err.value) and says in str(err.value)


def test_the_process_allocator_is_the_systems_unless_asked():
    assert load_config().orchestrator.cpu_allocator == "system"
    reuse = load_config(None, ["orchestrator.cpu_allocator=reuse"])
    assert reuse.orchestrator.cpu_allocator == "reuse"
