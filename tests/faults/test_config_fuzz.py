"""Bad input: random YAML configs and random ``--set`` overrides. Each one either
validates or fails with a :class:`ConfigError` whose every line names what is wrong (a
field, an override, the file); nothing else escapes (no traceback for the user)."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.config import Config, load_config
from agentrl.errors import ConfigError

SECTIONS = list(Config.model_fields)
FIELDS = sorted({f for s in SECTIONS for f in Config.model_fields[s].annotation.model_fields})
NAMES = st.sampled_from(SECTIONS + FIELDS) | st.text(min_size=0, max_size=8)

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["auto", "grpo", "ppo", "hf", "thread", "1e-3", "-1", "0", "on", "null"])
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3),
    max_leaves=8,
)
# mostly real sections and their own fields, so values reach the field validators
SECTION_FIELDS = {s: sorted(Config.model_fields[s].annotation.model_fields) for s in SECTIONS}
KNOWN = st.sampled_from(SECTIONS).flatmap(
    lambda section: st.tuples(
        st.just(section),
        st.dictionaries(st.sampled_from(SECTION_FIELDS[section]), VALUES, max_size=4),
    )
)
FIELD_CONFIGS = st.lists(KNOWN, max_size=4).map(dict)
DOTTED = st.sampled_from(SECTIONS).flatmap(
    lambda section: st.sampled_from(SECTION_FIELDS[section]).map(lambda f: f"{section}.{f}")
)
FIELD_OVERRIDES = st.lists(
    st.builds(
        lambda key, value: f"{key}={value}",
        DOTTED,
        st.text(max_size=10) | SCALARS.map(lambda v: yaml.safe_dump(v).split("\n...")[0].strip()),
    ),
    max_size=4,
)
CONFIGS = st.dictionaries(
    st.sampled_from(SECTIONS) | st.text(max_size=6),
    st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), VALUES, max_size=4) | VALUES,
    max_size=4,
)
OVERRIDES = st.lists(
    st.builds(
        lambda parts, value: ".".join(parts) + "=" + value,
        st.lists(NAMES, min_size=1, max_size=3),
        st.text(max_size=10) | SCALARS.map(lambda v: yaml.safe_dump(v).split("\n...")[0].strip()),
    )
    | st.text(max_size=15),
    max_size=4,
)


def _check(text: str, overrides: list[str]) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "c.yaml"
        path.write_text(text)
        try:
            cfg = load_config(path, overrides)
        except ConfigError as e:
            message = str(e)
            assert message.strip(), "an empty error"
            assert "Traceback" not in message
            head, *problems = message.splitlines()
            if head.startswith("invalid config"):  # then one line per field at fault
                assert problems, message
                for line in problems:
                    assert (line.startswith("  ") and ": " in line) or "unknown key" in line, line
            else:  # the file, the YAML, an override: one line
                assert not problems, message
            return
        # a config that validates must survive the round trip a run makes (run_dir/config.yaml)
        again = Config.model_validate(yaml.safe_load(cfg.to_yaml()))
        assert _same(again.model_dump(), cfg.model_dump())


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(CONFIGS, OVERRIDES)
def test_random_configs_and_overrides_validate_or_name_the_field(data, overrides):
    _check(yaml.safe_dump(data), overrides)


@FUZZ
@given(FIELD_CONFIGS, FIELD_OVERRIDES)
def test_random_values_of_real_fields_validate_or_name_the_field(data, overrides):
    _check(yaml.safe_dump(data), overrides)


@FUZZ
@given(st.text(max_size=60), OVERRIDES)
def test_random_yaml_text_is_a_config_error(text, overrides):
    _check(text, overrides)
