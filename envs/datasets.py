"""Task files: JSONL or parquet rows of ``{question, answer}`` (plus any extra fields).

Bad rows are errors that name the file, the line (1-based; the row for parquet) and the
field, so a user can fix the file: ``data.jsonl:3: missing field 'answer'``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.errors import DatasetError

FORMATS = (".jsonl", ".json", ".parquet")


def _check_row(row: Any, where: str, required: Sequence[str]) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise DatasetError(
            f"{where}: expected a JSON object with fields {', '.join(required)} "
            f"(got {type(row).__name__})"
        )
    for key in required:
        if key not in row or row[key] is None:
            raise DatasetError(
                f"{where}: missing field {key!r}; every row needs "
                + ", ".join(f"{k!r}" for k in required)
            )
        if isinstance(row[key], str) and not row[key].strip():
            raise DatasetError(f"{where}: field {key!r} is empty")
        if isinstance(row[key], (dict, list)):
            raise DatasetError(
                f"{where}: field {key!r} must be a string or a number (got {type(row[key]).__name__})"
            )
    return row


def _read_parquet(path: Path) -> list[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise DatasetError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from e
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:
        raise DatasetError(f"{path}: not a readable parquet file ({e})") from e
    return [(f"{path}: row {i + 1}", row) for i, row in enumerate(rows)]


def _read_jsonl(path: Path) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                out.append((f"{path}:{lineno}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
    return out


def load_task_file(
    path: str | Path, required: Sequence[str] = ("question", "answer"), id_prefix: str = ""
) -> list[dict[str, Any]]:
    """Read tasks from a ``.jsonl`` or ``.parquet`` file; each gets an ``id`` (its own
    ``id`` field if present, else ``<file stem>-<row>``) and a string ``answer``."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: no such task file")
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise DatasetError(f"{path}: unsupported task file type {suffix!r}; use .jsonl or .parquet")
    rows = _read_parquet(path) if suffix == ".parquet" else _read_jsonl(path)
    if not rows:
        raise DatasetError(f"{path}: the file holds no tasks")
    tasks = []
    for i, (where, row) in enumerate(rows):
        task = dict(_check_row(row, where, required))
        task["answer"] = str(task["answer"])
        task["id"] = str(task.get("id") or f"{id_prefix or path.stem}-{i}")
        tasks.append(task)
    return tasks
