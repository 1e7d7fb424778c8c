"""docs/config.md is generated from agentrl/config.py: every key documented, never stale."""

from pathlib import Path
from typing import Annotated

import pytest
from pydantic import Field, TypeAdapter
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.config import Config, _Section
from agentrl.config_reference import REGENERATE, collect, render

PAGE = Path(__file__).parent.parent / "docs" / "config.md"
KEYS = collect()


def test_docs_config_md_is_the_generated_reference():
    assert PAGE.is_file(), f"docs/config.md is missing: run `{REGENERATE}`"
    assert PAGE.read_text() == render(), f"docs/config.md is stale: run `{REGENERATE}`"


@pytest.mark.parametrize("doc", KEYS, ids=[k.key for k in KEYS])
def test_every_key_has_a_meaning_and_an_example(doc):
    assert len(doc.meaning) >= 8, (
        f"{doc.key} has no description: give it an attribute docstring in agentrl/config.py, "
        f"then run `{REGENERATE}`"
    )
    if not doc.holds_section:
        assert doc.example, (
            f"{doc.key}: no example can be derived from its type: end its docstring with a line "
            "Example: `value`"
        )


def _field(key: str):
    """The pydantic field of a dotted key (list items: reward.functions[].fn)."""
    model, field = Config, None
    for part in key.replace("[]", "").split("."):
        field = model.model_fields[part]
        model = next(iter(_models(field.annotation)), None)
    return field


def _models(annotation):
    if isinstance(annotation, type) and issubclass(annotation, _Section):
        return [annotation]
    return [m for a in getattr(annotation, "__args__", ()) for m in _models(a)]


@pytest.mark.parametrize("doc", [k for k in KEYS if k.example], ids=lambda k: k.key)
def test_every_example_is_a_valid_value_of_its_key(doc):
    import yaml

    field = _field(doc.key)
    typ = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
    TypeAdapter(typ).validate_python(yaml.safe_load(doc.example))


class _GatewaySection(_Section):
    """A section the schema may grow (the reference picks it up without a change here)."""

    port: int = 0
    """The port to listen on; 0 = any free one."""


class _Grown(Config):
    gateway: _GatewaySection = Field(default_factory=_GatewaySection)
    """The agent gateway."""


def test_a_new_section_appears_in_the_reference_on_its_own():
    text = render(_Grown)
    assert "## gateway" in text and "- [`gateway`](#gateway): The agent gateway." in text
    assert (
        "| `port` | int | `0` | The port to listen on; 0 = any free one. | `gateway.port=0` |"
        in (text)
    )
    # and a key without a description is caught by the test above
    assert {k.key for k in collect(_Grown)} - {k.key for k in KEYS} == {"gateway", "gateway.port"}


def test_agentrl_config_docs_writes_the_page_and_check_names_the_command(tmp_path):
    out = tmp_path / "config.md"
    out.write_text("old\n")
    runner = CliRunner()
    stale = runner.invoke(app, ["config", "docs", "--check", "--out", str(out)])
    assert stale.exit_code == 1 and REGENERATE in stale.output
    written = runner.invoke(app, ["config", "docs", "--out", str(out)])
    assert written.exit_code == 0 and out.read_text() == render()
    fresh = runner.invoke(app, ["config", "docs", "--check", "--out", str(out)])
    assert fresh.exit_code == 0, fresh.output
