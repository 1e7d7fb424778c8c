"""`agentrl rollout` and `agentrl inspect` end to end on the tiny model."""

from __future__ import annotations

import io
import json
import re

import pytest
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.rollout.sinks import read_groups

CONFIG = """
model: {name: tiny-llama}
sampler: {max_new_tokens: 8, max_batch_size: 16}
env:
  name: tests.rollout.scripted:ScriptedToolEnv
  options: {tool_turns: 2}
rollout: {group_size: 2, concurrency: 8, max_turns: 4, max_tokens: 200}
"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    (tmp / "c.yaml").write_text(CONFIG)
    out = tmp / "run"
    result = CliRunner().invoke(
        app,
        [
            "rollout",
            str(tmp / "c.yaml"),
            "--out",
            str(out),
            "-n",
            "3",
            "--set",
            "rollout.branching.enabled=true",
            "--set",
            "rollout.branching.budget=4",
            "--set",
            "rollout.branching.mode=threshold",
            "--set",
            "rollout.branching.alpha=1.0",
        ],
    )
    assert result.exit_code == 0, result.output
    return out, result.output


def test_rollout_writes_groups_and_prints_a_summary(run_dir):
    out, output = run_dir
    groups = read_groups(out / "trajectories.jsonl")
    assert len(groups) == 3
    assert all(len(g.trajectories) == 4 and g.is_tree for g in groups)
    for label in (
        "reward (mean)",
        "success rate",
        "tool calls (mean)",
        "parse errors",
        "infra errors",
        "tokens (mean)",
        "latency p50 (s)",
        "latency p95 (s)",
    ):
        assert label in output
    assert re.search(r"tool calls \(mean\)\s*│\s*2\.000", output)  # 2 tool turns each
    assert (out / "config.yaml").is_file()


def test_inspect_shows_turns_masks_tools_and_the_tree(run_dir):
    out, _ = run_dir
    groups = read_groups(out / "trajectories.jsonl")
    flat = [t for g in groups for t in g.trajectories]
    index = next(i for i, t in enumerate(flat) if t.parent_id is not None)
    result = CliRunner().invoke(app, ["inspect", str(out), "--index", str(index)])
    assert result.exit_code == 0, result.output
    text = result.output
    assert "trained (model) tokens" in text and "masked observation tokens" in text
    assert "turn 0 · model" in text and "observation ·" in text
    assert "tool calls" in text and "echo" in text
    assert "branch of" in text and "(shared prefix)" in text
    assert f"group {groups[0].group_id}" in text or "group " in text
    assert "<- shown" in text  # the selected leaf is marked in the branch tree


def test_inspect_styles_trained_and_masked_tokens_differently(run_dir):
    from rich.console import Console

    from agentrl.commands.rollout import MASKED, TRAINED, show_trajectory

    out, _ = run_dir
    group = read_groups(out)[0]
    console = Console(record=True, file=io.StringIO(), color_system="standard", width=120)
    show_trajectory(console, group, group.trajectories[0])
    ansi = console.export_text(styles=True)
    assert TRAINED != MASKED
    assert "\x1b[1;32m" in ansi and "\x1b[2;36m" in ansi  # bold green vs dim cyan


def test_inspect_bad_input_names_the_fix(run_dir, tmp_path):
    out, _ = run_dir
    result = CliRunner().invoke(app, ["inspect", str(out), "--index", "999"])
    assert result.exit_code == 2 and "out of range" in result.output
    result = CliRunner().invoke(app, ["inspect", str(tmp_path)])
    assert result.exit_code == 2 and "no trajectories" in result.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"nope": 1}) + "\n")
    result = CliRunner().invoke(app, ["inspect", str(bad)])
    assert result.exit_code == 2 and "bad.jsonl:1" in result.output


def test_rollout_bad_config_names_the_field(tmp_path):
    (tmp_path / "c.yaml").write_text(CONFIG)
    result = CliRunner().invoke(
        app, ["rollout", str(tmp_path / "c.yaml"), "--set", "rollout.group_sise=3"]
    )
    assert result.exit_code == 2 and "group_size" in result.output
