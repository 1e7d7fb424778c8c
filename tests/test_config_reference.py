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


class _TelemetrySection(_Section):
    """A section the schema may grow (the reference picks it up without a change here)."""

    port: int = 0
    """The port to listen on; 0 = any free one."""


class _Grown(Config):
    telemetry: _TelemetrySection = Field(default_factory=_TelemetrySection)
    """The telemetry exporter."""


def test_a_new_section_appears_in_the_reference_on_its_own():
    text = render(_Grown)
    assert "## telemetry" in text and "- [`telemetry`](#telemetry): The telemetry exporter." in text
    assert (
        "| `port` | int | `0` | The port to listen on; 0 = any free one. | `telemetry.port=0` |"
        in (text)
    )
    # and a key without a description is caught by the test above
    assert {k.key for k in collect(_Grown)} - {k.key for k in KEYS} == {
        "telemetry",
        "telemetry.port",
    }


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


def _meaning(key: str) -> str:
    return next(k.meaning for k in KEYS if k.key == key)


def test_the_options_mappings_name_every_option_the_code_takes():
    """The free-form ``options`` keys list what they accept; a new option in the code
    fails here until its key's docstring names it."""
    import inspect

    from agentrl.algos.registry import ADVANTAGES, POLICY_LOSSES, keyword_parameters
    from agentrl.config import load_config
    from agentrl.learner.objective import _RESERVED
    from agentrl.preference.losses import PREFERENCE_LOSSES
    from agentrl.rollout.hooks import GROUP_HOOKS
    from agentrl.run.settings import sampler_settings
    from agentrl.samplers import backend_class

    # set by the run itself (resume's version) or from first-class sampler keys
    internal = {"version", "initial_version", "tokenizer", "base_url", "api_key"}
    internal.add("max_concurrency")
    sampler_doc = _meaning("sampler.options")
    for backend in ("hf", "vllm", "openai"):
        cls = backend_class(backend)
        cfg = load_config(overrides=[f"sampler.backend={backend}"])
        filled = cls.options_from_settings(sampler_settings(cfg))
        params = inspect.signature(cls.__init__).parameters.items()
        own = [n for n, p in params if p.kind is p.KEYWORD_ONLY and n not in filled]
        missing = [n for n in own if n not in internal and n not in sampler_doc]
        assert not missing, f"sampler.options: document the {backend} options {missing}"
    algorithm_doc = _meaning("algorithm.options")
    for registry in (ADVANTAGES, POLICY_LOSSES):
        for name in registry.names():
            named = keyword_parameters(registry.get(name))[0]
            own = [p for p in named if p not in _RESERVED]  # the learner's own keywords
            assert all(p in algorithm_doc for p in own), f"algorithm.options: {name} takes {own}"
    preference_doc = _meaning("preference.options")
    for name in PREFERENCE_LOSSES.names():
        params = inspect.signature(PREFERENCE_LOSSES.get(name)).parameters
        own = [p for p in params if p not in ("pi", "beta")]  # beta: preference.beta
        assert all(p in preference_doc for p in own), f"preference.options: {name} takes {own}"
    hooks_doc = _meaning("rollout.group_hooks[].options")
    for name in GROUP_HOOKS.names():
        own = list(inspect.signature(GROUP_HOOKS.get(name)).parameters)[2:]
        assert all(p in hooks_doc for p in own), f"group hook {name} takes {own}"
