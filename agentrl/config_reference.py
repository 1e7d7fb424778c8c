"""The configuration reference (docs/config.md), generated from the schema in agentrl.config.

    agentrl config docs            # rewrite docs/config.md
    agentrl config docs --check    # exit 1 when docs/config.md is stale

Every key of every section (a section added to :class:`~agentrl.config.Config` appears on
its own) gets its type, default, meaning and one example. A key's meaning is its attribute
docstring (or ``Field(description=...)``); a last line ``Example: `value``` gives its
example, else one is derived from the type (another choice of a Literal, the other boolean,
the default).
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from agentrl.config import Config

REGENERATE = "agentrl config docs"  # the command that rewrites the page
DEFAULT_PATH = Path("docs/config.md")


@dataclass(frozen=True)
class KeyDoc:
    """One documented key: where it is, and the four things the reference says about it."""

    key: str  # dotted, e.g. algorithm.eps_low; items of a list of sections: reward.functions[].fn
    type: str
    default: str
    meaning: str
    example: str | None
    holds_section: bool = False  # its value is a section (or a list of them) with keys below


def _sections(annotation: Any) -> list[type[BaseModel]]:
    """The section models an annotation holds (``LoraConfig | None`` -> [LoraConfig])."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _sections(arg)]


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else str(a) for a in annotation.__args__)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    if annotation is Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


_BOUNDS = {
    annotated_types.Ge: (">=", "ge"),
    annotated_types.Gt: (">", "gt"),
    annotated_types.Le: ("<=", "le"),
    annotated_types.Lt: ("<", "lt"),
}


def _bounds(field: FieldInfo) -> str:
    out = []
    for meta in field.metadata:
        sign_attr = _BOUNDS.get(type(meta))
        if sign_attr:
            out.append(f"{sign_attr[0]} {getattr(meta, sign_attr[1])}")
    return f" ({', '.join(out)})" if out else ""


def _yaml_value(value: Any) -> str:
    """A value as one line of YAML flow style (what a user writes after ``key:``)."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, tuple):
        value = list(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def _default(field: FieldInfo) -> tuple[str, Any]:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required", PydanticUndefined
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section)", value
    return f"`{_yaml_value(value)}`", value


def _meaning_and_example(field: FieldInfo) -> tuple[str, str | None]:
    text = field.description or ""
    body, sep, example = text.rpartition("\nExample:")
    if not sep:
        return " ".join(text.split()), None
    return " ".join(body.split()), example.strip().strip("`")


def _derived_example(field: FieldInfo, default: Any) -> str | None:
    """An example from the type when the docstring gives none."""
    annotation = field.annotation
    choices = [
        a
        for arg in (annotation, *typing.get_args(annotation))
        if typing.get_origin(arg) is Literal
        for a in arg.__args__
    ]
    others = [c for c in choices if c != default]
    if others:
        return _yaml_value(others[0])
    if isinstance(default, bool):
        return _yaml_value(not default)
    if default is PydanticUndefined or default is None or default == [] or default == {}:
        return None
    if isinstance(default, BaseModel):
        return None
    return _yaml_value(default)


def collect(model: type[BaseModel] = Config, prefix: str = "") -> list[KeyDoc]:
    """Every key of `model`, depth first, in the schema's order (sections included)."""
    docs = []
    for name, field in model.model_fields.items():
        key = prefix + name
        default_text, default = _default(field)
        meaning, example = _meaning_and_example(field)
        subs = _sections(field.annotation)
        if example is None and not subs:
            example = _derived_example(field, default)
        type_text = _type_name(field.annotation) + _bounds(field)
        docs.append(KeyDoc(key, type_text, default_text, meaning, example, bool(subs)))
        is_list = typing.get_origin(field.annotation) is list or any(
            typing.get_origin(a) is list for a in typing.get_args(field.annotation)
        )
        for sub in subs:
            docs.extend(collect(sub, key + ("[]." if is_list else ".")))
    return docs


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(root: type[BaseModel] = Config) -> str:
    """The whole reference page, Markdown (`root`: the schema, Config unless a test says)."""
    keys = collect(root)
    out = [
        "# Configuration reference",
        "",
        f"<!-- generated from agentrl/config.py by `{REGENERATE}`: edit the docstrings there,",
        "     then rerun it (tests/test_config_reference.py fails when this page is stale) -->",
        "",
        "A run's config is YAML, one mapping per section (`configs/demo.yaml` is the default",
        "job). Any key can be set on the command line of `agentrl train`, `eval`, `rollout`,",
        "`serve`, `dpo` and `sft` with `--set section.key=value` (the value is read as",
        "YAML: `--set learner.betas=[0.9,0.95]`). `--set section.key=null` unsets a key, as",
        "if the file did not set it (its default applies); a key whose default is not null but",
        "that takes null (`data.answer`) is set to null. Unknown keys are errors that suggest",
        "the closest valid one, and every mistake of a config is reported at once, each with",
        "where its value came from (the YAML file and line, or the `--set` override), before",
        "a run folder is created or a model loads.",
        "",
        f"{sum(not k.holds_section for k in keys)} keys in {len(root.model_fields)} sections.",
        "",
    ]
    for section, field in root.model_fields.items():
        out.append(f"- [`{section}`](#{section}): {_cell(_meaning_and_example(field)[0])}")
    out.append("")
    children: dict[str, list[KeyDoc]] = {}
    for doc in keys:
        children.setdefault(doc.key.rsplit(".", 1)[0] if "." in doc.key else "", []).append(doc)
    for doc in children[""]:
        section_model = _sections(root.model_fields[doc.key].annotation)[0]
        out += ["", f"## {doc.key}", ""]
        if section_model.__doc__:
            out += [" ".join(section_model.__doc__.split()), ""]
        out += _table(doc.key, children)
    return "\n".join(out) + "\n"


def _table(parent: str, children: dict[str, list[KeyDoc]]) -> list[str]:
    """The keys of one section, then each of its sub-sections' tables."""
    out = ["| key | type | default | meaning | example |", "|---|---|---|---|---|"]
    subsections = []
    for doc in children.get(parent, []):
        name = doc.key.rsplit(".", 1)[1]
        meaning = doc.meaning
        if doc.holds_section:
            sub = next(k for k in children if k in (doc.key, doc.key + "[]"))
            subsections.append(sub)
            meaning += f" See [{sub}](#{sub.replace('.', '').replace('[]', '')})."
        # a list item's key is written inside the item; the others work as `--set key=value`
        where = f"{name}: " if "[]" in doc.key else f"{doc.key}="
        example = f"`{where}{doc.example}`" if doc.example else ""
        out.append(
            f"| `{name}` | {_cell(doc.type)} | {_cell(doc.default)} | {_cell(meaning)} | "
            f"{_cell(example)} |"
        )
    for sub in subsections:
        out += ["", f"### {sub}", "", *_table(sub, children)]
    return out


def write(path: Path = DEFAULT_PATH) -> bool:
    """Rewrite `path` with the current reference; True when it changed."""
    text = render()
    if path.is_file() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return True


if __name__ == "__main__":
    import sys

    changed = write(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_PATH)
    print(("rewritten" if changed else "up to date") + f" (regenerate with `{REGENERATE}`)")
