"""make_env / list_envs: built-ins, module:Class paths, and the errors for bad names."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl.envs import Environment, list_envs, make_env, safe_reset, safe_step
from agentrl.envs.base import AssistantTurn, StepResult
from agentrl.errors import ConfigError, EnvError, PluginError, UnknownNameError


def test_unknown_name_suggests_closest() -> None:
    with pytest.raises(
        UnknownNameError, match=r"unknown environment 'code_mth'.*did you mean 'code_math'"
    ):
        make_env("code_mth")
    with pytest.raises(UnknownNameError, match="search_qa"):
        make_env("nothing_like_it")


def test_bad_paths() -> None:
    with pytest.raises(PluginError, match="cannot import module 'no_such_module_xyz'"):
        make_env("no_such_module_xyz:Env")
    with pytest.raises(
        PluginError,
        match=r"has no attribute 'ExactMatchVerifer'.*did you mean 'ExactMatchVerifier'",
    ):
        make_env("agentrl.envs.verifiers:ExactMatchVerifer")
    with pytest.raises(PluginError, match=r"not an agentrl\.envs\.Environment subclass"):
        make_env("agentrl.envs.verifiers:ExactMatchVerifier")
    with pytest.raises(PluginError, match="must look like"):
        make_env(":Env")


def test_unknown_option_names_option_and_fix() -> None:
    with pytest.raises(ConfigError, match=r"unknown option 'generatrs'.*did you mean 'generators'"):
        make_env("code_math", generatrs=["chain_sum"])
    with pytest.raises(
        ConfigError, match=r"unknown reasoning-gym generator 'chain_summ'.*'chain_sum'"
    ):
        make_env("code_math", generators=["chain_summ"])
    with pytest.raises(ConfigError, match=r"option 'size'"):
        make_env("code_math", size=0)


def test_list_envs_builtins() -> None:
    rows = {r.name: r for r in list_envs()}
    assert rows["code_math"].source == "builtin" and rows["code_math"].error is None
    assert rows["code_math"].tools == ["python"]
    assert rows["search_qa"].tools == ["search"]
    assert rows["search_qa"].description


def test_cli_envs_list_json() -> None:
    from agentrl.cli import app

    result = CliRunner().invoke(app, ["envs", "list", "--json"])
    assert result.exit_code == 0, result.output
    names = [r["name"] for r in json.loads(result.output)]
    assert {"code_math", "search_qa"} <= set(names)
    table = CliRunner().invoke(app, ["envs", "list"])
    assert table.exit_code == 0 and "code_math" in table.output


class _Broken(Environment):
    """Raises where an environment must not."""

    async def reset(self, task: dict) -> list:
        raise RuntimeError("disk on fire")

    async def step(self, turn: AssistantTurn) -> StepResult:
        return StepResult(observations=[{"role": "tool", "content": {}["missing"]}])


@pytest.mark.anyio
async def test_env_exceptions_become_env_error() -> None:
    env = _Broken()
    with pytest.raises(EnvError, match=r"_Broken\.reset raised: RuntimeError\('disk on fire'\)"):
        await safe_reset(env, {"id": "t"})
    with pytest.raises(EnvError, match=r"_Broken\.step raised: KeyError"):
        await safe_step(env, AssistantTurn(text="hi", token_ids=[1]))


def test_module_class_path_on_sys_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tiny_env_mod.py").write_text(
        "from agentrl.envs import Environment, StepResult\n"
        "class Tiny(Environment):\n"
        "    '''A tiny environment.'''\n"
        "    async def reset(self, task): return [{'role': 'user', 'content': 'hi'}]\n"
        "    async def step(self, turn): return StepResult(done=True, outcome=1.0)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    env = make_env("tiny_env_mod:Tiny", flavour="x")
    assert type(env).__name__ == "Tiny" and env.options == {"flavour": "x"}
    assert type(env.spawn()) is type(env)
    sys.modules.pop("tiny_env_mod", None)
