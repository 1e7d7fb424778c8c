"""Preference data: pairs and unpaired rows, rendered token-exactly as ``agentrl sft`` does.

A JSONL row (or a row of a ``data.path`` dataset) is one of:

* a pair: ``{"prompt": P, "chosen": C, "rejected": R, "tools": [...]?}``, where ``P`` is a
  string (one user turn) or a list of messages, and ``C`` / ``R`` a string (one assistant
  turn) or the list of messages that continue ``P`` (assistant turns with ``tool_calls``,
  ``tool`` results, more assistant turns);
* a pair without ``prompt``: ``chosen`` and ``rejected`` are whole conversations, and the
  prompt is the messages they share from the start;
* an unpaired row (KTO): ``{"prompt": P, "completion": C, "label": true|false}``.

Each conversation is encoded by :func:`agentrl.training.sft.encode_transcript` (the episode layout:
prompt, model segments, observation deltas, the runtime prefix check), and the loss mask
keeps only the assistant turns after the prompt (a prompt's own assistant turns are
context). A bad row is a :class:`~agentrl.errors.DatasetError` naming its line and field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.envs.dataset import DataSettings, read_jsonl
from agentrl.errors import DatasetError
from agentrl.training.sft import encode_transcript

Message = dict[str, Any]


@dataclass
class Completion:
    """One rendered sequence: its ids and the mask of the tokens the loss covers."""

    input_ids: list[int]
    loss_mask: list[int]

    @property
    def trained(self) -> int:
        return sum(self.loss_mask)


@dataclass
class PreferencePair:
    chosen: Completion
    rejected: Completion
    where: str


@dataclass
class UnpairedExample:
    completion: Completion
    desirable: bool
    kl: Completion  # the same prompt with another row's completion (KTO's z_0 estimate)
    where: str


@dataclass
class Row:
    """A validated row: prompt messages, and chosen/rejected (or completion) messages."""

    where: str
    prompt: list[Message]
    chosen: list[Message] | None = None
    rejected: list[Message] | None = None
    completion: list[Message] | None = None
    label: bool | None = None
    tools: list[Any] | None = None

    @property
    def paired(self) -> bool:
        return self.chosen is not None


# --- reading rows --------------------------------------------------------------------


def _messages(value: Any, role: str, where: str, field: str) -> list[Message]:
    if isinstance(value, str):
        if not value.strip():
            raise DatasetError(f"{where}: field {field!r} is empty")
        return [{"role": role, "content": value}]
    if (
        isinstance(value, list)
        and value
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in value)
    ):
        return [{k: v for k, v in m.items() if v is not None} for m in value]
    raise DatasetError(
        f"{where}: field {field!r} must be a string or a list of {{role, content}} messages "
        f"(got {str(value)[:60]!r})"
    )


def _label(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "false", "good", "bad"):
        return value.lower() in ("true", "good")
    raise DatasetError(f"{where}: field 'label' must be true or false (got {value!r})")


def _split_shared(chosen: list[Message], rejected: list[Message], where: str) -> tuple:
    """(prompt, chosen rest, rejected rest) of two whole conversations."""
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    if n == 0:
        raise DatasetError(
            f"{where}: 'chosen' and 'rejected' share no first message and there is no "
            "'prompt' field: add 'prompt', or start both conversations with the same turns"
        )
    while n > 0 and chosen[n - 1]["role"] == "assistant":
        n -= 1  # the prompt ends with the turn the model answers
    return chosen[:n], chosen[n:], rejected[n:]


def parse_row(row: Any, where: str) -> Row:
    """Validate one raw row (a dict from JSON or a dataset) into a :class:`Row`."""
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object (got {type(row).__name__})")
    tools = row.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise DatasetError(f"{where}: field 'tools' must be a list of tool schemas")
    if "completion" in row or "label" in row:
        for key in ("prompt", "completion", "label"):
            if row.get(key) is None:
                raise DatasetError(
                    f"{where}: missing field {key!r}; an unpaired row needs 'prompt', "
                    "'completion' and 'label'"
                )
        return Row(
            where,
            _messages(row["prompt"], "user", where, "prompt"),
            completion=_messages(row["completion"], "assistant", where, "completion"),
            label=_label(row["label"], where),
            tools=tools,
        )
    for key in ("chosen", "rejected"):
        if row.get(key) is None:
            raise DatasetError(
                f"{where}: missing field {key!r}; a pair needs 'chosen' and 'rejected' (and "
                "'prompt' unless both are whole conversations); an unpaired row needs "
                "'prompt', 'completion' and 'label'"
            )
    chosen = _messages(row["chosen"], "assistant", where, "chosen")
    rejected = _messages(row["rejected"], "assistant", where, "rejected")
    if row.get("prompt") is None:
        prompt, chosen, rejected = _split_shared(chosen, rejected, where)
    else:
        prompt = _messages(row["prompt"], "user", where, "prompt")
    for field, msgs in (("chosen", chosen), ("rejected", rejected)):
        if not msgs or msgs[0]["role"] != "assistant":
            raise DatasetError(
                f"{where}: field {field!r} must start with an assistant turn (it continues "
                "the prompt)"
            )
    if chosen == rejected:
        raise DatasetError(f"{where}: 'chosen' and 'rejected' are the same")
    return Row(where, prompt, chosen=chosen, rejected=rejected, tools=tools)


def read_jsonl_rows(path: str | Path) -> list[Row]:
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such preference file")
    rows = [parse_row(raw, where) for where, raw in read_jsonl(path)]
    if not rows:
        raise DatasetError(f"{path}: no rows")
    return rows


def read_dataset_rows(settings: DataSettings, split: str | None = None) -> list[Row]:
    """Rows of ``data.path`` (any local file or folder ``datasets`` reads, see
    :class:`~agentrl.envs.dataset.DataSettings`); ``data.max_rows`` applies."""
    from agentrl.envs.dataset import DatasetSource

    source = None
    for column in ("chosen", "completion"):  # the source checks that this column exists
        try:
            source = DatasetSource(
                dataclasses.replace(settings, messages=column, prompt=None, answer=None, id=None)
            )
            break
        except DatasetError as e:
            if not str(e).startswith("data.messages"):
                raise
    if source is None:
        raise DatasetError(
            f"data.path {settings.path}: no 'chosen' column (pairs: prompt, chosen, rejected) "
            "and no 'completion' column (unpaired rows: prompt, completion, label)"
        )
    name = split or settings.split
    rows = []
    for index, raw in enumerate(source.split(name)):
        if settings.max_rows is not None and index >= settings.max_rows:
            break
        rows.append(parse_row(dict(raw), f"{source.where} (split {name!r}, row {index})"))
    if not rows:
        raise DatasetError(f"data.path {source.where}: split {name!r} has no rows")
    return rows


def read_rows(data: str | Path | None, settings: DataSettings) -> list[Row]:
    """A JSONL file `data` (any other file or folder goes through ``datasets``), else the
    config's ``data.path``."""
    if data is not None:
        path = Path(data)
        if path.suffix.lower() == ".jsonl" and path.is_file():
            return read_jsonl_rows(path)  # read here: errors name the line
        settings = dataclasses.replace(settings, path=str(path))
    if settings.path is None:
        raise DatasetError(
            "no preference data: pass a JSONL file, or set data.path to a dataset file or folder"
        )
    return read_dataset_rows(settings)


def as_unpaired(rows: list[Row]) -> list[Row]:
    """Pairs split into a desirable and an undesirable row (unpaired rows kept)."""
    out = []
    for r in rows:
        if not r.paired:
            out.append(r)
            continue
        out.append(Row(r.where, r.prompt, completion=r.chosen, label=True, tools=r.tools))
        out.append(Row(r.where, r.prompt, completion=r.rejected, label=False, tools=r.tools))
    return out


# --- encoding ------------------------------------------------------------------------


def _after_prompt(example: Any, prompt: list[Message]) -> Completion:
    """Zero the loss mask on the prompt's own assistant turns (each one contiguous run)."""
    skip = sum(1 for m in prompt if m.get("role") == "assistant")
    mask = list(example.loss_mask)
    t = 0
    while skip and t < len(mask):
        if mask[t]:
            while t < len(mask) and mask[t]:
                mask[t] = 0
                t += 1
            skip -= 1
        t += 1
    return Completion(list(example.input_ids), mask)


def encode(renderer: Any, prompt: list[Message], rest: list[Message], where: str) -> Completion:
    if prompt and prompt[-1].get("role") == "assistant":
        raise DatasetError(
            f"{where}: the prompt ends with an assistant message; it must end with the user "
            "or tool turn the model answers"
        )
    return _after_prompt(encode_transcript(renderer, [*prompt, *rest], where), prompt)


RendererFor = Callable[[list[Any] | None], Any]


def encode_pairs(rows: list[Row], renderer_for: RendererFor) -> list[PreferencePair]:
    pairs = []
    for r in rows:
        if not r.paired:
            raise DatasetError(
                f"{r.where}: an unpaired row (prompt/completion/label) needs an unpaired "
                "loss (--loss kto)"
            )
        renderer = renderer_for(r.tools)
        assert r.chosen is not None and r.rejected is not None
        pairs.append(
            PreferencePair(
                encode(renderer, r.prompt, r.chosen, f"{r.where} (chosen)"),
                encode(renderer, r.prompt, r.rejected, f"{r.where} (rejected)"),
                r.where,
            )
        )
    return pairs


def encode_unpaired(
    rows: list[Row], renderer_for: RendererFor, seed: int = 0
) -> list[UnpairedExample]:
    """Unpaired examples; each row's KL partner is the completion of another row (a fixed
    seeded derangement), so its reference log-prob can be cached like the rest."""
    rows = as_unpaired(rows)
    if len(rows) < 2:
        raise DatasetError(
            "KTO needs at least 2 rows (its KL estimate pairs prompts with other rows' completions)"
        )
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    partner = {order[i]: order[(i + 1) % len(order)] for i in range(len(order))}
    out = []
    for i, r in enumerate(rows):
        renderer = renderer_for(r.tools)
        other = rows[partner[i]]
        assert r.completion is not None and other.completion is not None and r.label is not None
        out.append(
            UnpairedExample(
                encode(renderer, r.prompt, r.completion, f"{r.where} (completion)"),
                r.label,
                encode(renderer, r.prompt, other.completion, f"{r.where} (KL with {other.where})"),
                r.where,
            )
        )
    return out


def fingerprint(examples: list[Any], model: str) -> str:
    """A digest of the encoded examples and the model, keying the reference cache."""
    h = hashlib.sha256(model.encode())
    for seq in iter_completions(examples):
        h.update(json.dumps([seq.input_ids, seq.loss_mask]).encode())
    return h.hexdigest()[:16]


def iter_completions(examples: list[Any]) -> Iterator[Completion]:
    for e in examples:
        if isinstance(e, PreferencePair):
            yield e.chosen
            yield e.rejected
        else:
            yield e.completion
            yield e.kl
