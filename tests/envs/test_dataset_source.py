"""Tasks from local files through Hugging Face datasets: formats, mapping, order, resume."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from agentrl.config import load_config
from agentrl.envs.dataset import DatasetEnv
from agentrl.errors import ConfigError, DatasetError
from agentrl.rollout.tasks import TaskCursor
from agentrl.run.components import build_env

ROWS = [{"problem": f"What is {i} + 1?", "solution": i + 1, "level": i % 3} for i in range(40)]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _env(*overrides: str, split: str = "train"):
    return build_env(load_config(overrides=list(overrides)), split)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return _jsonl(tmp_path_factory.mktemp("data") / "train.jsonl", ROWS)


def test_jsonl_rows_become_tasks_with_every_column(data: Path) -> None:
    env = _env(f"data.path={data}", "data.prompt=problem", "data.answer=solution")
    assert isinstance(env, DatasetEnv)  # the default environment of a dataset
    tasks = list(env.tasks(seed=0))
    assert len(tasks) == len(ROWS)
    t = tasks[0]
    row = ROWS[int(t["id"].split("-")[1])]  # ids name the row, whatever the order
    assert t["question"] == row["problem"] and t["answer"] == str(row["solution"])
    assert t["level"] == row["level"] and t["solution"] == row["solution"]  # columns as they are
    messages = anyio.run(env.spawn().reset, t)
    assert messages == [{"role": "user", "content": row["problem"]}]


def test_seeded_shuffle_is_a_permutation_fixed_by_the_seed(data: Path) -> None:
    env = _env(f"data.path={data}", "data.prompt=problem")
    ids = lambda seed: [t["id"] for t in env.tasks(seed=seed)]  # noqa: E731
    assert ids(0) == ids(0)
    assert ids(0) != ids(1)
    assert sorted(ids(0)) == sorted(f"train-{i}" for i in range(len(ROWS)))
    plain = _env(f"data.path={data}", "data.prompt=problem", "data.shuffle=false")
    assert [t["id"] for t in plain.tasks(seed=0)] == [f"train-{i}" for i in range(len(ROWS))]


@pytest.mark.parametrize("streaming", [False, True])
def test_cursor_resumes_exactly(data: Path, streaming: bool) -> None:
    over = [f"data.path={data}", "data.prompt=problem", f"data.streaming={streaming}"]
    over.append("data.shuffle_buffer=8")
    whole = TaskCursor.for_env(_env(*over), seed=3)
    expected = [whole.take()[1]["id"] for _ in range(100)]  # 2.5 epochs
    first = TaskCursor.for_env(_env(*over), seed=3)
    seen = []
    for _ in range(55):
        index, task = first.take()
        first.settle(index)  # its group was trained
        seen.append(task["id"])
    in_flight = first.take()[0]  # taken, not settled when the checkpoint is written
    state = first.state_dict()
    resumed = TaskCursor.for_env(_env(*over), seed=3)  # a new process: a fresh source
    resumed.load_state_dict(state)
    assert resumed.take() == (in_flight, first.task(in_flight))  # re-issued first
    rest = [resumed.take()[1]["id"] for _ in range(100 - 56)]
    assert [*seen, expected[55], *rest] == expected


def test_formats_and_splits(tmp_path: Path) -> None:
    import datasets

    ds = datasets.Dataset.from_list(ROWS[:6])
    ds.to_csv(tmp_path / "d.csv")
    ds.to_parquet(tmp_path / "d.parquet")
    datasets.DatasetDict({"train": ds, "test": ds.select(range(2))}).save_to_disk(
        tmp_path / "saved"
    )
    for path in ("d.csv", "d.parquet", "saved"):
        env = _env(f"data.path={tmp_path / path}", "data.prompt=problem")
        assert sorted(t["question"] for t in env.tasks()) == sorted(r["problem"] for r in ROWS[:6])
    _jsonl(tmp_path / "a.jsonl", ROWS[:5])
    _jsonl(tmp_path / "b.jsonl", ROWS[5:7])
    splits = [f"data.path={{train: {tmp_path / 'a.jsonl'}, test: {tmp_path / 'b.jsonl'}}}"]
    splits += ["data.prompt=problem", "data.eval_split=test"]
    assert len(list(_env(*splits).tasks())) == 5
    held_out = _env(*splits, split="eval")
    assert [t["id"] for t in held_out.tasks(split="eval")] != []
    assert {t["question"] for t in held_out.tasks(split="eval")} == {
        r["problem"] for r in ROWS[5:7]
    }


def test_chat_column(tmp_path: Path) -> None:
    rows = [
        {"chat": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}
    ]
    env = _env(f"data.path={_jsonl(tmp_path / 'c.jsonl', rows)}", "data.messages=chat")
    task = next(env.tasks())
    assert task["question"] == "Hi"
    assert anyio.run(env.spawn().reset, task) == rows[0]["chat"]


def test_bad_input_is_one_clear_message(data: Path, tmp_path: Path) -> None:
    with pytest.raises(
        DatasetError,
        match=r"data.prompt: column 'problm' is not in .*train.jsonl.*did you mean 'problem'.*its columns: problem, solution, level",
    ):
        _env(f"data.path={data}", "data.prompt=problm")
    with pytest.raises(
        DatasetError, match=r"no prompt column \(looked for prompt, question\).*Set data.prompt"
    ):
        _env(f"data.path={data}")
    with pytest.raises(DatasetError, match=r"data.answer: column 'answer' is not in"):
        _env(f"data.path={data}", "data.prompt=problem", "data.answer=answer")
    with pytest.raises(DatasetError, match=r"no split 'test'.*its splits: train"):
        _env(f"data.path={data}", "data.prompt=problem", "data.eval_split=test")
    with pytest.raises(ConfigError, match=r"data.eval_split, which is not set"):
        _env(f"data.path={data}", "data.prompt=problem", split="eval")
    with pytest.raises(DatasetError, match="no such file"):
        _env(f"data.path={tmp_path / 'missing.jsonl'}")
    bad = _jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok"}, {"prompt": ""}])
    with pytest.raises(DatasetError, match=r"row 1\): column 'prompt' must hold non-empty text"):
        list(_env(f"data.path={bad}", "data.shuffle=false").tasks())
