"""Tasks from a user's dataset: any local file Hugging Face ``datasets`` reads.

    data:
      path: data/train.jsonl            # or a glob, a folder, {train: a.jsonl, test: b.jsonl},
      prompt: problem                   #    a .csv / .parquet / .arrow file, a save_to_disk folder
      answer: solution
      eval_split: test

Every row becomes a task: its columns as they are (all of them reach the reward functions),
plus ``question`` (the prompt column's text), ``answer`` (the reference, as a string, when
mapped), ``messages`` (when a chat column is mapped) and ``id``. Columns are checked when
the run starts: a missing one is a :class:`~agentrl.errors.DatasetError` naming it, the
file and the columns that exist.

Order: one seeded shuffle per epoch (seed + epoch), so a run's task stream is fixed by its
seed and a resumed run (:class:`agentrl.rollout.tasks.TaskCursor`) sees exactly the same order.
``streaming: true`` reads the rows lazily (large files), shuffling within a buffer of
``shuffle_buffer`` rows (also seeded, so also exact on resume).

:class:`DatasetEnv` is the environment a dataset runs in when no other is named: one chat
turn answering the prompt (or the row's messages), scored by ``reward.functions`` (and by
a verifier if asked); any other environment can take the dataset's tasks instead of its own.

:func:`load_task_file` is the small reader environments use for their own ``dataset_path``
option: ``{question, answer}`` rows of a JSONL or parquet file, each bad row an error that
names the file, the line (1-based; the row for parquet) and the field, so a user can fix
the file: ``data.jsonl:3: missing field 'answer'``.
"""

from __future__ import annotations

import glob as globlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agentrl._suggest import suggest
from agentrl.envs.base import Environment, EnvOptions, ToolEnvironment
from agentrl.envs.verifiers import ExactMatchVerifier, MathVerifier, Verifier
from agentrl.errors import ConfigError, DatasetError
from agentrl.extras import require

BUILDERS = {
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".arrow": "arrow",
}
PROMPT_COLUMNS = ("prompt", "question")
_ROW = "__agentrl_row__"


def _files_of(path: str) -> list[Path]:
    return [Path(p) for p in sorted(globlib.glob(path))] if any(c in path for c in "*?[") else []


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and any(
        (path / f).is_file() for f in ("dataset_dict.json", "dataset_info.json", "state.json")
    )


def _builder(files: list[Path], fmt: str, where: str) -> str:
    if fmt != "auto":
        return fmt
    suffixes = {f.suffix.lower() for f in files}
    builders = {BUILDERS.get(s) for s in suffixes}
    if len(builders) != 1 or None in builders:
        raise DatasetError(
            f"data.path {where}: cannot tell the format from the file names "
            f"({', '.join(sorted(suffixes)) or 'no files'}); use .jsonl, .json, .csv, .parquet "
            "or .arrow files, or set data.format"
        )
    return builders.pop()  # type: ignore[return-value]


@dataclass(frozen=True)
class DataSettings:
    """``data``, resolved by the run layer (:func:`agentrl.run.settings.data_settings`)."""

    path: str | dict[str, str] | None = None
    format: str = "auto"
    split: str = "train"
    eval_split: str | None = None
    prompt: str | None = None
    messages: str | None = None
    answer: str | None = "answer"
    id: str | None = None
    columns: tuple[str, ...] | None = None
    shuffle: bool = True
    streaming: bool = False
    shuffle_buffer: int = 10_000
    max_rows: int | None = None
    # data.answer was set by the user (a missing default 'answer' column is then an error)
    answer_explicit: bool = False


class DatasetSource:
    """The rows of ``data.path`` (:class:`DataSettings`) as task streams.

    Loading and the column check happen in the constructor, so a wrong column fails the
    run before any model loads."""

    def __init__(self, data: DataSettings) -> None:
        if data.path is None:
            raise ConfigError("data.path is not set: name the dataset file or folder")
        self.data = data
        self.where = str(data.path)
        self.splits = self._load()
        self.prompt_column = self._check_columns()

    # --- loading -----------------------------------------------------------------------

    def _load(self) -> Any:
        """``{split: Dataset | IterableDataset}``."""
        datasets = require("datasets", "datasets", "data.path")

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()
        data = self.data
        if isinstance(data.path, dict):
            files = {split: str(Path(p).expanduser()) for split, p in data.path.items()}
            for split, p in files.items():
                if not (Path(p).exists() or _files_of(p)):
                    raise DatasetError(f"data.path.{split}: no such file or folder {p!r}")
            flat = [f for p in files.values() for f in (_files_of(p) or [Path(p)])]
            return self._load_files(_builder(flat, data.format, self.where), files)
        path = Path(data.path).expanduser()
        if data.format == "disk" or (data.format == "auto" and _is_saved_dataset(path)):
            return self._load_saved(path)
        if path.is_dir():
            inner = [p for p in sorted(path.rglob("*")) if p.suffix.lower() in BUILDERS]
            if not inner:
                raise DatasetError(
                    f"data.path {self.where}: the folder holds no .jsonl/.json/.csv/.parquet/"
                    ".arrow file and is not a dataset saved with save_to_disk"
                )
            return self._load_files(_builder(inner, data.format, self.where), None, folder=path)
        files = _files_of(str(path)) or ([path] if path.is_file() else [])
        if not files:
            raise DatasetError(f"data.path {self.where}: no such file, folder or glob match")
        return self._load_files(_builder(files, data.format, self.where), str(path))

    def _load_files(self, builder: str, files: Any, folder: Path | None = None) -> Any:
        load_dataset = require("datasets", "datasets", "data.path").load_dataset

        try:
            if folder is not None:  # train.jsonl / test.jsonl ... name their splits
                loaded = load_dataset(str(folder), streaming=self.data.streaming)
            else:
                loaded = load_dataset(builder, data_files=files, streaming=self.data.streaming)
        except Exception as e:
            raise DatasetError(
                f"data.path {self.where}: could not read it as {builder}: {e}"
            ) from e
        return dict(loaded)

    def _load_saved(self, path: Path) -> Any:
        hf_datasets = require("datasets", "datasets", "data.path")
        Dataset, load_from_disk = hf_datasets.Dataset, hf_datasets.load_from_disk

        try:
            loaded = load_from_disk(str(path))
        except Exception as e:
            raise DatasetError(f"data.path {self.where}: not a saved dataset folder: {e}") from e
        splits = {"train": loaded} if isinstance(loaded, Dataset) else dict(loaded)
        if self.data.streaming:
            splits = {k: v.to_iterable_dataset() for k, v in splits.items()}
        return splits

    # --- columns -----------------------------------------------------------------------

    def split(self, name: str) -> Any:
        if name not in self.splits:
            raise DatasetError(
                f"data.path {self.where} has no split {name!r}{suggest(name, self.splits)}; "
                f"its splits: {', '.join(self.splits)} (set data.split / data.eval_split, or "
                "give data.path as {split: file})"
            )
        return self.splits[name]

    def columns(self, split: str) -> list[str]:
        ds = self.split(split)
        names = ds.column_names
        if names is None:  # a stream whose features are unknown until read: peek one row
            first = next(iter(ds), None)
            names = list(first) if first is not None else []
        return list(names)

    def _check_columns(self) -> str | None:
        data = self.data
        columns = self.columns(data.split)
        label = f"{self.where} (split {data.split!r})"

        def need(key: str, column: str) -> None:
            if column not in columns:
                raise DatasetError(
                    f"data.{key}: column {column!r} is not in {label}{suggest(column, columns)}; "
                    f"its columns: {', '.join(columns)}. Set data.{key}=<column>"
                )

        prompt = data.prompt
        if data.messages is not None:
            need("messages", data.messages)
        elif prompt is not None:
            need("prompt", prompt)
        else:
            prompt = next((c for c in PROMPT_COLUMNS if c in columns), None)
            if prompt is None:
                raise DatasetError(
                    f"{label} has no prompt column (looked for {', '.join(PROMPT_COLUMNS)}); its "
                    f"columns: {', '.join(columns)}. Set data.prompt=<column> or "
                    "data.messages=<chat column>"
                )
        if data.answer is not None and (data.answer_explicit or "answer" in columns):
            need("answer", data.answer)
        if data.id is not None:
            need("id", data.id)
        for column in data.columns or []:
            need("columns", column)
        if data.eval_split is not None:
            self.split(data.eval_split)
        return prompt

    @property
    def has_answer(self) -> bool:
        return self.data.answer is not None and self.data.answer in self.columns(self.data.split)

    # --- tasks -------------------------------------------------------------------------

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
        """One epoch of ``split`` ("train" means data.split, "eval" data.eval_split), in
        the order `seed` fixes."""
        data = self.data
        name = data.split if split == "train" else (data.eval_split or split)
        answer = data.answer if self.has_answer else None
        for n, (index, row) in enumerate(self._rows(self.split(name), seed)):
            if data.max_rows is not None and n >= data.max_rows:
                return
            yield self._task(row, name, index, answer)

    def _rows(self, ds: Any, seed: int) -> Iterator[tuple[int, dict[str, Any]]]:
        """(row index in the split, row), in the seeded order; the index names the task."""
        data = self.data
        if data.streaming:
            ds = ds.map(lambda row, i: {**row, _ROW: i}, with_indices=True)
            if data.shuffle:
                ds = ds.shuffle(seed=seed, buffer_size=data.shuffle_buffer)
            for row in ds:
                index = row.pop(_ROW)
                yield index, row
            return
        if not data.shuffle:
            yield from enumerate(ds)
            return
        import numpy as np

        for index in np.random.default_rng(seed).permutation(len(ds)).tolist():
            yield index, ds[index]

    def _task(self, row: dict[str, Any], split: str, index: int, answer: str | None) -> dict:
        data = self.data
        keep = data.columns if data.columns is not None else list(row)
        task = {k: row[k] for k in keep}
        where = f"{self.where} (split {split!r}, row {index})"
        if data.messages is not None:
            task["messages"] = _messages(row[data.messages], data.messages, where)
            task.setdefault("question", _last_user(task["messages"]))
        else:
            assert self.prompt_column is not None
            text = row[self.prompt_column]
            if not isinstance(text, str) or not text.strip():
                raise DatasetError(
                    f"{where}: column {self.prompt_column!r} must hold non-empty text "
                    f"(got {text!r})"
                )
            task["question"] = text
        if answer is not None:
            if row[answer] is None:
                raise DatasetError(f"{where}: column {answer!r} is empty")
            task["answer"] = str(row[answer])
        task["id"] = str(row[data.id]) if data.id is not None else f"{split}-{index}"
        return task


def _messages(value: Any, column: str, where: str) -> list[dict[str, Any]]:
    ok = (
        isinstance(value, list)
        and value
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in value
        )
    )
    if not ok:
        raise DatasetError(
            f"{where}: column {column!r} must hold a chat, a list of {{role, content}} messages "
            f"(got {str(value)[:80]!r})"
        )
    if value[-1]["role"] == "assistant":
        raise DatasetError(
            f"{where}: the chat in column {column!r} ends with an assistant message; a prompt "
            "ends with the turn the model answers (drop the last message)"
        )
    return [{k: v for k, v in m.items() if v is not None} for m in value]


def _last_user(messages: list[dict[str, Any]]) -> str:
    users = [m for m in messages if m["role"] == "user"]
    return str(users[-1]["content"]) if users else ""


def attach_dataset(env: Environment, data: DataSettings, split: str = "train") -> DatasetSource:
    """Make ``data`` (:class:`DataSettings`) the task source of `env` (the
    run's prototype environment; episodes are its spawns and never read tasks)."""
    source = DatasetSource(data)
    if split == "eval" and data.eval_split is None:
        raise ConfigError(
            "evaluation reads data.eval_split, which is not set: name a split of data.path "
            f"(its splits: {', '.join(source.splits)}), e.g. data.eval_split=test"
        )
    env.tasks = source.tasks  # type: ignore[method-assign]
    return source


# --- task files of an environment's own (dataset_path) ----------------------------------------

TASK_FILE_FORMATS = (".jsonl", ".json", ".parquet")


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
    pq = require("pyarrow.parquet", "datasets", f"{path}: reading parquet")
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:
        raise DatasetError(f"{path}: not a readable parquet file ({e})") from e
    return [(f"{path}: row {i + 1}", row) for i, row in enumerate(rows)]


def read_jsonl(path: Path) -> list[tuple[str, Any]]:
    """(``path:line``, parsed row) of every non-blank line; bad JSON names its line."""
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
    if suffix not in TASK_FILE_FORMATS:
        raise DatasetError(f"{path}: unsupported task file type {suffix!r}; use .jsonl or .parquet")
    rows = _read_parquet(path) if suffix == ".parquet" else read_jsonl(path)
    if not rows:
        raise DatasetError(f"{path}: the file holds no tasks")
    tasks = []
    for i, (where, row) in enumerate(rows):
        task = dict(_check_row(row, where, required))
        task["answer"] = str(task["answer"])
        task["id"] = str(task.get("id") or f"{id_prefix or path.stem}-{i}")
        tasks.append(task)
    return tasks


# --- the environment a dataset runs in by default -------------------------------------------


class _NoVerifier:
    """Scores nothing: the reward comes from reward.functions / reward.model / reward.judge."""

    def score(self, answer_text: str, task: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        return 0.0, {"scorer": "none"}


VERIFIERS: dict[str, type] = {
    "none": _NoVerifier,
    "math": MathVerifier,
    "exact_match": ExactMatchVerifier,
}


class DatasetEnvOptions(EnvOptions):
    system_prompt: str | None = None
    # the environment's own score of the final answer against task["answer"] (weighted by
    # reward.env_weight); none = only reward.functions / model / judge score
    verifier: Literal["none", "math", "exact_match"] = "none"


class DatasetEnv(ToolEnvironment):
    """One chat turn per dataset row, scored by reward functions (and an optional verifier)."""

    name = "dataset"
    Options = DatasetEnvOptions
    config: DatasetEnvOptions

    def make_verifier(self) -> Verifier:
        return VERIFIERS[self.config.verifier]()

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
        raise ConfigError("the dataset environment reads its tasks from data.path: set it")

    async def reset(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        messages = await super().reset(task)
        system = self.config.system_prompt
        if "messages" in task:
            chat = [dict(m) for m in task["messages"]]
            if system and chat[0]["role"] != "system":
                chat.insert(0, {"role": "system", "content": system})
            return chat
        return messages if system else messages[1:]

    def system_prompt(self) -> str:
        return self.config.system_prompt or ""
