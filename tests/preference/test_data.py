"""Preference rows: rendered as `agentrl sft` renders them, loss only on the answer turns,
bad rows named by line and field, dataset folders through the data section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.chat import ChatRenderer
from agentrl.config import load_config
from agentrl.errors import DatasetError
from agentrl.models import load_tokenizer
from agentrl.preference.data import encode_pairs, encode_unpaired, read_jsonl_rows, read_rows
from agentrl.run.settings import data_settings
from agentrl.training.sft import encode_transcript

TOOL = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}},
    },
}


def call(code: str) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"type": "function", "function": {"name": "python", "arguments": {"code": code}}}
        ],
    }


def tool_pair(a: int, b: int) -> dict:
    """A multi-turn tool conversation: the chosen answer uses the tool and is right."""
    return {
        "prompt": [
            {"role": "system", "content": "Use the python tool."},
            {"role": "user", "content": f"What is {a} * {b}?"},
        ],
        "chosen": [
            call(f"print({a} * {b})"),
            {"role": "tool", "name": "python", "content": str(a * b)},
            {"role": "assistant", "content": f"\\boxed{{{a * b}}}"},
        ],
        "rejected": [{"role": "assistant", "content": f"\\boxed{{{a * b + 1}}}"}],
        "tools": [TOOL],
    }


def write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def renderer_for():
    tok = load_tokenizer("tiny-llama")
    cache: dict = {}

    def make(tools):
        key = json.dumps(tools)
        if key not in cache:
            cache[key] = ChatRenderer(tok, tools=tools)
        return cache[key]

    return make


def test_tool_pairs_are_the_sft_tokens_with_the_prompt_masked(tmp_path: Path, renderer_for) -> None:
    row = tool_pair(12, 34)
    (pair,) = encode_pairs(read_jsonl_rows(write(tmp_path / "p.jsonl", [row])), renderer_for)
    sft = encode_transcript(renderer_for([TOOL]), row["prompt"] + row["chosen"], "x")
    assert pair.chosen.input_ids == sft.input_ids and pair.chosen.loss_mask == sft.loss_mask
    r = renderer_for([TOOL])
    trained = [
        t for t, m in zip(pair.rejected.input_ids, pair.rejected.loss_mask, strict=True) if m
    ]
    assert trained == r.encode("\\boxed{409}") + list(r.end_of_turn_ids)
    # both share the prompt tokens exactly
    n = len(r.prompt_ids(row["prompt"]))
    assert pair.chosen.input_ids[:n] == pair.rejected.input_ids[:n] == r.prompt_ids(row["prompt"])


def test_a_prompts_own_assistant_turns_are_context(tmp_path: Path, renderer_for) -> None:
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello there"},
        {"role": "user", "content": "2+2?"},
    ]
    row = {"prompt": history, "chosen": "4", "rejected": "5"}
    (pair,) = encode_pairs(read_jsonl_rows(write(tmp_path / "h.jsonl", [row])), renderer_for)
    r = renderer_for(None)
    trained = [t for t, m in zip(pair.chosen.input_ids, pair.chosen.loss_mask, strict=True) if m]
    assert trained == r.encode("4") + list(r.end_of_turn_ids)
    # the implicit-prompt form (whole conversations) gives the same pair
    whole = {
        "chosen": [*history, {"role": "assistant", "content": "4"}],
        "rejected": [*history, {"role": "assistant", "content": "5"}],
    }
    (same,) = encode_pairs(read_jsonl_rows(write(tmp_path / "w.jsonl", [whole])), renderer_for)
    assert same.chosen == pair.chosen and same.rejected == pair.rejected


def test_unpaired_rows_get_kl_partners_from_other_rows(tmp_path: Path, renderer_for) -> None:
    rows = [{"prompt": f"q{i}", "completion": f"a{i}", "label": i % 2 == 0} for i in range(4)] + [
        {"prompt": "q9", "chosen": "yes", "rejected": "no"}
    ]
    examples = encode_unpaired(read_jsonl_rows(write(tmp_path / "u.jsonl", rows)), renderer_for)
    assert len(examples) == 6  # the pair became a desirable and an undesirable row
    assert [e.desirable for e in examples] == [True, False, True, False, True, False]
    r = renderer_for(None)
    for e in examples:
        prompt_len = len(r.prompt_ids([{"role": "user", "content": "x"}]))  # same length here
        assert e.kl.input_ids[:prompt_len] == e.completion.input_ids[:prompt_len]
        assert e.kl.input_ids != e.completion.input_ids


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("{not json", r"bad\.jsonl:2: invalid JSON"),
        ({"prompt": "q", "chosen": "a"}, r"bad\.jsonl:2: missing field 'rejected'"),
        ({"prompt": "q", "chosen": "", "rejected": "b"}, r"bad\.jsonl:2: field 'chosen' is empty"),
        ({"prompt": "q", "chosen": 3, "rejected": "b"}, r"bad\.jsonl:2: field 'chosen' must be"),
        ({"prompt": "q", "completion": "a"}, r"bad\.jsonl:2: missing field 'label'"),
        ({"prompt": "q", "completion": "a", "label": "maybe"}, r"bad\.jsonl:2: field 'label'"),
        (
            {"prompt": "q", "chosen": "a", "rejected": "a"},
            r"bad\.jsonl:2: 'chosen' and 'rejected' are the same",
        ),
        (
            {
                "chosen": [{"role": "user", "content": "x"}],
                "rejected": [{"role": "user", "content": "y"}],
            },
            r"bad\.jsonl:2: 'chosen' and 'rejected' share no first message",
        ),
    ],
)
def test_bad_rows_name_line_and_field(tmp_path: Path, row, message: str) -> None:
    path = write(tmp_path / "bad.jsonl", [{"prompt": "q", "chosen": "a", "rejected": "b"}, row])
    with pytest.raises(DatasetError, match=message):
        read_jsonl_rows(path)


def test_a_datasets_folder_through_the_data_section(tmp_path: Path) -> None:
    folder = tmp_path / "prefs"
    folder.mkdir()
    write(
        folder / "train.jsonl",
        [{"prompt": f"q{i}", "chosen": "a", "rejected": "b"} for i in range(3)],
    )
    cfg = load_config(overrides=[f"data.path={folder}"])
    rows = read_rows(None, data_settings(cfg))
    assert len(rows) == 3 and rows[0].where.endswith("(split 'train', row 0)")
    write(folder / "train.jsonl", [{"question": "q"}])
    with pytest.raises(DatasetError, match="no 'chosen' column"):
        read_rows(None, data_settings(cfg))
