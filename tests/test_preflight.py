"""Every config problem at once, each with its source, before a command creates anything."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.run.preflight import check_run_config, load_run_config

DEMO = Path(__file__).parent.parent / "configs" / "demo.yaml"


def _two_mistakes(tmp_path: Path) -> Path:
    """The demo with a misspelt advantage on line 4 of the file."""
    path = tmp_path / "run.yaml"
    text = DEMO.read_text().replace("  advantage: grpo\n", "  advantage: grpoo\n")
    path.write_text(text)
    return path


def _line(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def test_train_reports_a_yaml_and_a_set_mistake_together_and_creates_no_run_folder(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # the default run folder would be runs/ under here
    path = _two_mistakes(tmp_path)
    run_dir = tmp_path / "the_run"
    result = CliRunner().invoke(
        app,
        ["train", str(path), "--set", "learner.lr=-1", "--run-dir", str(run_dir), "--no-summary"],
    )
    assert result.exit_code == 2, result.output
    out = " ".join(result.output.split())  # the terminal may wrap long lines
    assert "invalid config, 2 problems:" in out
    line = _line(path, "advantage: grpoo")
    assert f"algorithm.advantage ({path}, line {line}): unknown advantage 'grpoo'" in out
    assert "did you mean 'grpo'" in out
    # the override's mistake names the override, not the file
    assert "learner.lr (--set learner.lr=-1): Input should be greater than 0" in out
    assert not run_dir.exists() and not (tmp_path / "runs").exists()


def test_cross_checks_run_beside_the_name_checks_and_name_every_source(tmp_path):
    path = _two_mistakes(tmp_path)
    sets = ["sampler.options={kv_cach: static}", "learner.world_size=2"]
    sets += ["orchestrator.learner_worker=thread", "rollout.workflow=no_such_workflow"]
    sets += ["rollout.group_hooks=[ghpo_hnit]"]
    with pytest.raises(ConfigError) as e:
        load_run_config(path, sets, "train")
    text = str(e.value)
    assert text.startswith("invalid config, 5 problems:")
    assert "rollout.group_hooks (--set rollout.group_hooks=[ghpo_hnit]): unknown group_hook" in text
    assert "rollout.workflow (--set rollout.workflow=no_such_workflow): unknown workflow" in text
    assert "sampler.options (--set sampler.options={kv_cach: static}): " in text
    assert "did you mean 'kv_cache'" in text
    # a problem spanning two keys shows where each came from
    assert (
        "learner.world_size (--set learner.world_size=2; orchestrator.learner_worker: "
        "--set orchestrator.learner_worker=thread)"
    ) in text


def test_the_algorithm_cross_checks_run_once_every_name_is_known(tmp_path):
    sets = ["algorithm.policy_loss=gmpo"]
    with pytest.raises(ConfigError) as e:
        load_run_config(DEMO, sets, "train")
    line = _line(DEMO, "eps_low:")
    assert f"algorithm.eps_low ({DEMO}, line {line}): algorithm.eps_low is set but policy loss" in (
        str(e.value)
    )
    unset = [*sets, "algorithm.eps_low=null", "algorithm.eps_high=null"]
    assert load_run_config(DEMO, unset, "train").algorithm.policy_loss == "gmpo"


def test_only_what_a_command_uses_is_checked():
    sets = ["algorithm.advantage=nope", "preference.loss=nope"]
    with pytest.raises(ConfigError, match=r"1 problem:\n  preference.loss"):
        load_run_config(None, sets, "preference")
    with pytest.raises(ConfigError, match=r"1 problem:\n  algorithm.advantage"):
        load_run_config(None, sets, "train")
    assert load_run_config(None, sets, "rollout").algorithm.advantage == "nope"


def test_a_config_built_in_code_is_checked_too():
    cfg = load_config(overrides=["env.name=code_mat"])
    with pytest.raises(ConfigError, match=r"env.name \(--set env.name=code_mat\): unknown env"):
        check_run_config(cfg, "eval")


@pytest.mark.parametrize(
    ("command", "creates"),
    [
        (["eval", "{cfg}", "--checkpoint", "{tmp}/ckpt"], None),
        (["rollout", "{cfg}", "--out", "{tmp}/out"], "out"),
        (["serve", "{cfg}", "--out", "{tmp}/out"], "out"),
        (["sft", "{tmp}/demos.jsonl", "--out", "{tmp}/out", "--config", "{cfg}"], "out"),
        (["dpo", "{tmp}/pairs.jsonl", "--run-dir", "{tmp}/out", "--config", "{cfg}"], "out"),
    ],
    ids=lambda c: c[0] if isinstance(c, list) else str(c),
)
def test_every_command_that_takes_a_config_reports_all_problems_first(tmp_path, command, creates):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("env:\n  name: code_mat\n")
    args = [a.format(cfg=cfg, tmp=tmp_path) for a in command] + ["--set", "sampler.top_p=2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    out = " ".join(result.output.split())
    assert f"env.name ({cfg}, line 2): unknown environment 'code_mat'" in out
    assert "sampler.top_p (--set sampler.top_p=2): Input should be less than or equal to 1" in out
    if creates:
        assert not (tmp_path / creates).exists()


def test_the_python_api_checks_before_the_run_folder_too(tmp_path):
    from agentrl.run.orchestrator import Orchestrator

    cfg = load_config(DEMO, ["algorithm.advantage=grpoo", "env.name=code_mat"])
    orch = Orchestrator(cfg, tmp_path / "run")
    with pytest.raises(ConfigError, match=r"2 problems:\n  algorithm.advantage .*\n  env.name"):
        orch.build()
    assert not (tmp_path / "run").exists()


def test_devices_are_checked_where_the_run_places_them():
    sets = ["learner.device=cuda:99"]  # no machine here has 100 GPUs
    with pytest.raises(ConfigError, match=r"learner.device \(--set learner.device=cuda:99\)"):
        load_run_config(None, sets, "train")
    # under Ray the learner's node resolves its device, not this one
    assert load_run_config(None, [*sets, "orchestrator.backend=ray"], "train")
