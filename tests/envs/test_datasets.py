"""Task files: good rows load; bad rows name the file, the line and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.envs.dataset import load_task_file
from agentrl.errors import DatasetError


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_jsonl_loads(tmp_path: Path) -> None:
    f = _write_jsonl(
        tmp_path / "t.jsonl",
        [{"question": "1+1?", "answer": 2}, "", {"id": "x7", "question": "2*3?", "answer": "6"}],
    )
    tasks = load_task_file(f)
    assert [t["id"] for t in tasks] == ["t-0", "x7"]
    assert tasks[0]["answer"] == "2"  # numbers become strings


def test_missing_field_names_file_line_field(tmp_path: Path) -> None:
    f = _write_jsonl(tmp_path / "bad.jsonl", [{"question": "a", "answer": "1"}, {"question": "b"}])
    with pytest.raises(DatasetError, match=r"bad\.jsonl:2: missing field 'answer'"):
        load_task_file(f)


def test_invalid_json_and_wrong_types(tmp_path: Path) -> None:
    f = _write_jsonl(tmp_path / "j.jsonl", [{"question": "a", "answer": "1"}, "{not json"])
    with pytest.raises(DatasetError, match=r"j\.jsonl:2: invalid JSON"):
        load_task_file(f)
    f = _write_jsonl(tmp_path / "k.jsonl", [["a", "b"]])
    with pytest.raises(DatasetError, match=r"k\.jsonl:1: expected a JSON object"):
        load_task_file(f)
    f = _write_jsonl(tmp_path / "e.jsonl", [{"question": "  ", "answer": "1"}])
    with pytest.raises(DatasetError, match=r"e\.jsonl:1: field 'question' is empty"):
        load_task_file(f)


def test_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such task file"):
        load_task_file(tmp_path / "missing.jsonl")
    (tmp_path / "t.csv").write_text("question,answer\n")
    with pytest.raises(DatasetError, match=r"use \.jsonl or \.parquet"):
        load_task_file(tmp_path / "t.csv")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DatasetError, match="holds no tasks"):
        load_task_file(tmp_path / "empty.jsonl")


def test_parquet(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"question": ["1+1?", "2+2?"], "answer": ["2", "4"]}), good)
    assert [t["answer"] for t in load_task_file(good)] == ["2", "4"]
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"question": ["1+1?", "2+2?"], "answer": ["2", None]}), bad)
    with pytest.raises(DatasetError, match=r"bad\.parquet: row 2: missing field 'answer'"):
        load_task_file(bad)
    nocol = tmp_path / "nocol.parquet"
    pq.write_table(pa.table({"prompt": ["1+1?"]}), nocol)
    with pytest.raises(DatasetError, match=r"nocol\.parquet: row 1: missing field 'question'"):
        load_task_file(nocol)
