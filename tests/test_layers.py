"""The layer rules of docs/architecture.md hold: import-linter's contracts in pyproject.toml.

A failure names the import that points the wrong way. An ``ignore_imports`` entry that no
longer matches any import also fails: delete that line (the reshape removed the import).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def lint(package_parent: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` over the agentrl found under `package_parent`, with this repository's contracts."""
    # `python -c` puts its working folder first on sys.path: run beside the package to check
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    config = ROOT / "pyproject.toml"
    code = (
        "import sys; from importlinter.cli import lint_imports; "
        f"sys.exit(lint_imports(config_filename={str(config)!r}, no_cache=True, no_logo=True))"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=package_parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_package_keeps_its_layer_contracts() -> None:
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_import_against_the_layers_inside_a_function_breaks_a_contract(tmp_path: Path) -> None:
    # a copy of the package with one wrong-way arrow: an environment importing the gateway
    shutil.copytree(
        ROOT / "agentrl", tmp_path / "agentrl", ignore=shutil.ignore_patterns("__pycache__")
    )
    (tmp_path / "agentrl" / "envs" / "wrong_way.py").write_text(
        "def serve():\n    from agentrl.gateway import server\n    return server\n"
    )
    result = lint(tmp_path)
    assert result.returncode != 0
    assert "agentrl.envs.wrong_way -> agentrl.gateway" in result.stdout
