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


def test_the_process_allocator_is_tcmalloc_where_installed_unless_asked():
    assert load_config().orchestrator.cpu_allocator == "auto"
    for mode in ("tcmalloc", "compact", "reuse", "system"):
        cfg = load_config(None, [f"orchestrator.cpu_allocator={mode}"])
        assert cfg.orchestrator.cpu_allocator == mode


DEMO = Path(__file__).parent.parent / "configs" / "demo.yaml"


def test_set_null_unsets_a_key_so_the_demo_switches_to_gmpo_without_a_yaml_edit():
    from agentrl.learner.objective import check_algorithm
    from agentrl.run.settings import objective_settings

    gmpo = ["algorithm.policy_loss=gmpo"]
    # the demo's clip range is for ppo: gmpo clips in log space and takes neither bound
    with pytest.raises(ConfigError, match=r"algorithm.eps_low is set but policy loss 'gmpo'"):
        check_algorithm(objective_settings(load_config(DEMO, gmpo)))
    cfg = load_config(DEMO, [*gmpo, "algorithm.eps_low=null", "algorithm.eps_high=null"])
    assert {"eps_low", "eps_high"}.isdisjoint(cfg.algorithm.model_fields_set)
    assert cfg.algorithm.eps_low == 0.2  # the default applies again
    assert check_algorithm(objective_settings(cfg)).alg.policy_loss == "gmpo"
    assert cfg.source_of("algorithm.eps_low") == "--set algorithm.eps_low=null"


def test_set_null_writes_null_where_null_is_a_value_and_unsets_the_rest(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "sampler: {seed: 3}\nenv:\n  options: {difficulty: easy, size: 2}\n"
        "model: {lora: {r: 8}}\nlogging: {wandb: {mode: offline}}\n"
    )
    sets = [
        "sampler.seed=null",  # default null: unset, null either way
        "data.answer=null",  # takes null, default "answer": null means no answer column
        "env.options.difficulty=null",  # inside a free-form mapping: the option is dropped
        "model.lora=null",  # a whole optional section
        "logging.wandb=~",  # a section that does not take null: back to its default
    ]
    cfg = load_config(path, sets)
    assert cfg.sampler.seed is None and cfg.data.answer is None
    assert cfg.env.options == {"size": 2}
    assert cfg.model.lora is None and cfg.logging.wandb.mode == "disabled"
    # a misspelt key keeps its null, so the error names it
    with pytest.raises(ConfigError, match=r"unknown key 'sampler.sed'.*did you mean 'seed'"):
        load_config(path, ["sampler.sed=null"])


def test_every_problem_names_where_its_value_came_from(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("learner:\n  lr: 1.0e-5\n  batch_groups: 0\nrollout: {max_turns: 2}\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, ["rollout.max_turns=-1", "algorithm.eps_low=-0.5"])
    head, *lines = str(e.value).splitlines()
    assert head == "invalid config, 3 problems:"
    assert f"learner.batch_groups ({path}, line 3): Input should be greater than or equal to 1" in (
        lines[0] + lines[1] + lines[2]
    )
    text = str(e.value)
    assert "rollout.max_turns (--set rollout.max_turns=-1): " in text  # not blamed on the file
    assert "algorithm.eps_low (--set algorithm.eps_low=-0.5): " in text
