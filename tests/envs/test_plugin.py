"""The plug-in example of agentrl/envs/README.md, loaded as a user would: by module:Class and by
an ``agentrl.envs`` entry point (a real dist-info folder on sys.path, which is what
``pip install`` leaves behind), then run for a whole episode with the real python tool."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.envs import AssistantTurn, list_envs, make_env, resolve
from agentrl.errors import PluginError

README = Path(__file__).resolve().parents[2] / "agentrl" / "envs" / "README.md"


def readme_example() -> str:
    text = README.read_text(encoding="utf-8").split("<!-- plugin-example -->", 1)[1]
    match = re.search(r"```python\n(.*?)```", text, re.S)
    assert match, "agentrl/envs/README.md lost its plug-in example"
    return match.group(1)


@pytest.fixture
def installed_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    pkg = tmp_path / "my_envs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "digit_sum.py").write_text(readme_example())
    dist = tmp_path / "my_envs_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-envs-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[agentrl.envs]\ndigit_sum = my_envs.digit_sum:DigitSumEnv\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m == "my_envs" or m.startswith("my_envs.")]:
        del sys.modules[name]


def test_example_is_one_small_file() -> None:
    assert len(readme_example().strip().splitlines()) < 80


def test_load_by_module_class(installed_plugin: Path) -> None:
    env = make_env("my_envs.digit_sum:DigitSumEnv", digits=12, size=5)
    tasks = list(env.tasks(seed=3))
    assert len(tasks) == 5 and tasks == list(env.tasks(seed=3))
    n = tasks[0]["question"].split()[-1].rstrip("?")
    assert len(n) == 12 and tasks[0]["answer"] == str(sum(int(d) for d in n))
    assert env.tool_schemas()[0]["function"]["name"] == "python"


def test_load_by_entry_point(installed_plugin: Path) -> None:
    assert resolve("digit_sum").__name__ == "DigitSumEnv"
    rows = {r.name: r for r in list_envs()}
    assert rows["digit_sum"].source == "plugin (my-envs-plugin)"
    assert rows["digit_sum"].tools == ["python"] and rows["digit_sum"].error is None
    assert rows["digit_sum"].description == "Sum the digits of a long number, using python."
    from agentrl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"unknown option 'digit'.*did you mean 'digits'"):
        make_env("digit_sum", digit=3)


@pytest.mark.anyio
async def test_plugin_episode_with_real_python(installed_plugin: Path) -> None:
    env = make_env("digit_sum", digits=20, size=1).spawn()
    task = next(env.tasks(seed=0))
    n = task["question"].split()[-1].rstrip("?")
    try:
        messages = await env.reset(task)
        assert [m["role"] for m in messages] == ["system", "user"]
        call = (
            '<tool_call>\n{"name": "python", "arguments": {"code": '
            f'"print(sum(int(d) for d in \\"{n}\\"))"}}}}\n</tool_call>'
        )
        result = await env.step(AssistantTurn(text=call, token_ids=[]))
        assert not result.done and result.step_reward is None and result.outcome is None
        assert result.observations[0]["role"] == "tool"
        assert result.observations[0]["content"].strip() == task["answer"]
        final = await env.step(AssistantTurn(text=f"\\boxed{{{task['answer']}}}", token_ids=[]))
        assert final.done and final.outcome == 1.0
    finally:
        await env.close()


def test_module_class_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README's `env: {name: my_envs.digit_sum:DigitSumEnv}` with my_envs/ next to the config:
    the `agentrl` console script does not put the working directory on sys.path, the
    loader looks there (after everything installed) as ``python -m`` would."""
    (tmp_path / "my_envs").mkdir()
    (tmp_path / "my_envs" / "__init__.py").write_text("")
    (tmp_path / "my_envs" / "digit_sum.py").write_text(readme_example())
    here = {str(tmp_path), "", "."}
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in here])
    monkeypatch.chdir(tmp_path)
    try:
        env = make_env("my_envs.digit_sum:DigitSumEnv", digits=12, size=2)
        assert len(list(env.tasks())) == 2
        assert sys.path[-1] == str(tmp_path)  # last: an installed module wins over a folder
        with pytest.raises(PluginError, match=f"not_here.*under {re.escape(str(tmp_path))}"):
            make_env("not_here.envs:Env")
        assert sys.path.count(str(tmp_path)) == 1
    finally:
        for name in [m for m in sys.modules if m == "my_envs" or m.startswith("my_envs.")]:
            del sys.modules[name]
