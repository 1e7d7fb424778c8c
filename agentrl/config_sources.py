"""Where each value of a run config came from, and the one error that lists every problem.

    sources = Sources.from_yaml(text, "configs/demo.yaml")   # every key -> its file line
    sources.set("algorithm.eps_low", "--set algorithm.eps_low=-1")
    sources.of("algorithm.eps_low")                          # '--set algorithm.eps_low=-1'
    raise ConfigError(report([Problem("algorithm.eps_low", "must be >= 0")], sources))

A problem names its key; the report adds where that key's value was written (the file and
line, or the override), so a mistake made with ``--set`` is never blamed on the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

DEFAULT = "default"  # a key nobody set


@dataclass(frozen=True)
class Problem:
    """One mistake in a config: the dotted key at fault ('' = the whole config) and why."""

    key: str
    message: str
    related: tuple[str, ...] = ()  # other keys the message names: their sources are shown too


class Sources:
    """Dotted key -> where its value was written; a key inherits its section's source."""

    def __init__(self) -> None:
        self._where: dict[str, str] = {}
        self._sections: set[str] = set()  # keys written as a mapping: each key below has its own

    @classmethod
    def from_yaml(cls, text: str, path: str) -> Sources:
        """Every key of a YAML config mapped to ``path, line N`` (PyYAML's node marks)."""
        sources = cls()
        try:
            root = yaml.compose(text)
        except yaml.YAMLError:  # the caller reports the YAML error itself
            return sources

        def walk(node: Any, prefix: str) -> None:
            if not isinstance(node, yaml.MappingNode):
                return
            for key_node, value_node in node.value:
                key = f"{prefix}{key_node.value}"
                sources._where[key] = f"{path}, line {key_node.start_mark.line + 1}"
                if isinstance(value_node, yaml.MappingNode):
                    sources._sections.add(key)
                walk(value_node, key + ".")

        walk(root, "")
        return sources

    @classmethod
    def from_mapping(cls, data: Any, label: str) -> Sources:
        """Every key of a nested dict attributed to `label` (a config built in code)."""
        sources = cls()

        def walk(node: Any, prefix: str) -> None:
            if isinstance(node, dict):
                for key, value in node.items():
                    sources._where[f"{prefix}{key}"] = label
                    if isinstance(value, dict):
                        sources._sections.add(f"{prefix}{key}")
                    walk(value, f"{prefix}{key}.")

        walk(data, "")
        return sources

    def set(self, key: str, where: str) -> None:
        """`key` (and everything under it) now comes from `where`."""
        for old in [k for k in self._where if k.startswith(key + ".")]:
            del self._where[old]
            self._sections.discard(old)
        self._where[key] = where
        self._sections.discard(key)

    def of(self, key: str) -> str:
        """Where `key`'s value came from: its own entry, the value it is part of (a list, a
        mapping set whole), the keys under it (a section-wide problem), else ``default``."""
        if key in self._where:
            return self._where[key]
        parts = key.split(".") if key else []
        for end in range(len(parts) - 1, 0, -1):
            prefix = ".".join(parts[:end])
            if prefix in self._where and prefix not in self._sections:
                return self._where[prefix]
        below = sorted({w for k, w in self._where.items() if not key or k.startswith(key + ".")})
        if below:
            return "; ".join(below[:3]) + ("; ..." if len(below) > 3 else "")
        return DEFAULT


def report(problems: list[Problem], sources: Sources, what: str = "invalid config") -> str:
    """One message for every problem, each on its own line with its key's source."""
    lines = []
    for p in problems:
        label = p.key or "<root>"
        if not label.isprintable():  # a key with a line break must not split the message
            label = repr(label)[1:-1]
        where = sources.of(p.key)
        others = [(k, sources.of(k)) for k in p.related]
        where = "; ".join([where] + [f"{k}: {w}" for k, w in others if w not in (DEFAULT, where)])
        if not where.isprintable():
            where = repr(where)[1:-1]
        lines.append(f"{label} ({where}): {p.message}")
    count = f"{len(problems)} problems" if len(problems) > 1 else "1 problem"
    return f"{what}, {count}:\n  " + "\n  ".join(lines)
