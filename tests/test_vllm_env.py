"""The vLLM environment (`.venv-vllm`, built by `make test-vllm`) holds all of agentrl next to
vLLM: every declared requirement is installed, and every module, built-in environment, tool
and command loads there."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import pkgutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="needs .venv-vllm (make test-vllm)")

from packaging.requirements import Requirement  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

import agentrl  # noqa: E402
from agentrl.cli import app  # noqa: E402
from agentrl.envs.registry import BUILTINS, make_env, resolve  # noqa: E402
from agentrl.errors import ConfigError  # noqa: E402


def test_every_declared_requirement_is_installed():
    missing = []
    for line in importlib.metadata.requires("agentrl") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": "dev"}):
            continue  # an extra other than dev (tensorboard, docker, ray, wandb, vllm)
        try:
            installed = importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"{req} (not installed)")
            continue
        if not req.specifier.contains(installed, prereleases=True):
            missing.append(f"{req} (installed {installed})")
    assert not missing, "run scripts/setup_vllm.sh: " + "; ".join(missing)


def _programs() -> set[str]:
    """The package's files that are programs run in a sandbox, not modules (the wheel
    check's own list)."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "wheel_check.py"
    spec = importlib.util.spec_from_file_location("wheel_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return set(module.PROGRAMS)


def test_every_module_imports():
    failed, programs = {}, _programs()
    for module in pkgutil.walk_packages(agentrl.__path__, "agentrl."):
        if module.name in programs:
            continue
        try:
            importlib.import_module(module.name)
        except Exception as e:  # collect them all, then report
            failed[module.name] = f"{type(e).__name__}: {e}"
    assert not failed, failed


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_every_builtin_environment_builds_with_its_tools(name):
    resolve(name)
    try:
        env = make_env(name)
        task = next(iter(env.tasks()))
    except ConfigError as e:  # e.g. `agent` needs a program, `dataset` a data.path
        pytest.skip(f"{name} needs settings to build ({e}); its class loads")
    assert task["id"]
    for schema in env.tool_schemas():
        assert schema["function"]["name"]


def test_every_builtin_tool_imports():
    from agentrl import tools

    for name in tools._LAZY:
        assert getattr(tools, name) is not None


def test_every_command_loads():
    runner = CliRunner()
    commands = [c.name or c.callback.__name__ for c in app.registered_commands]
    commands += [g.name for g in app.registered_groups]
    assert "train" in commands and "eval" in commands
    for command in commands:
        result = runner.invoke(app, [command, "--help"])
        assert result.exit_code == 0, (command, result.output)
    listed = runner.invoke(app, ["envs", "list"])
    assert listed.exit_code == 0 and "code_math" in listed.output, listed.output
