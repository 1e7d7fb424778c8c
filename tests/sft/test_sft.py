"""agentrl sft: transcripts rendered as RL renders episodes, assistant-only loss, a folder
RL and transformers load."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from agentrl.chat import ChatRenderer
from agentrl.config import Config, load_config
from agentrl.errors import DatasetError
from agentrl.models import load_tokenizer
from agentrl.run.runtime import assemble
from agentrl.run.settings import sft_settings
from agentrl.training.sft import encode_transcript, train_sft

PYTHON_TOOL = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}},
    },
}


def demo(a: int, b: int) -> list[dict]:
    code = f"print({a} * {b})"
    return [
        {"role": "system", "content": "Solve it with the python tool."},
        {"role": "user", "content": f"What is {a} * {b}?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"type": "function", "function": {"name": "python", "arguments": {"code": code}}}
            ],
        },
        {"role": "tool", "name": "python", "content": str(a * b)},
        {"role": "assistant", "content": f"\\boxed{{{a * b}}}"},
    ]


@pytest.fixture(scope="module")
def renderer() -> ChatRenderer:
    return ChatRenderer(load_tokenizer("tiny-llama"), tools=[PYTHON_TOOL])


def test_transcript_tokens_and_mask_are_the_rollouts(renderer: ChatRenderer) -> None:
    messages = demo(12, 34)
    ex = encode_transcript(renderer, messages, "row")
    call = '<tool_call>\n{"name": "python", "arguments": {"code": "print(12 * 34)"}}\n</tool_call>'
    as_text = [*messages[:2], {"role": "assistant", "content": call}, messages[3], messages[4]]
    full = renderer.render_ids(as_text, add_generation_prompt=False)
    assert ex.input_ids == full[: len(ex.input_ids)]  # the template's own tokens
    assert full[len(ex.input_ids) :] == renderer.encode("\n")  # all but the final newline
    trained = [t for t, m in zip(ex.input_ids, ex.loss_mask, strict=True) if m]
    im_end = renderer.end_of_turn_ids
    assert trained == renderer.encode(call) + im_end + renderer.encode("\\boxed{408}") + im_end
    # the tool result, the prompt and the tools' schemas are never trained
    assert sum(ex.loss_mask) == len(trained) < len(ex.input_ids) // 2


def test_bad_transcripts_name_the_row(renderer: ChatRenderer) -> None:
    with pytest.raises(DatasetError, match="r1: no assistant message"):
        encode_transcript(renderer, [{"role": "user", "content": "hi"}], "r1")
    two = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}]
    with pytest.raises(DatasetError, match=r"r2 \(message 2\): two assistant messages in a row"):
        encode_transcript(renderer, [*two, {"role": "assistant", "content": "b"}], "r2")


def test_sft_learns_the_call_format_and_rl_starts_from_it(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    data = tmp_path / "demos.jsonl"
    rows = [{"messages": demo(a, a + 7), "tools": [PYTHON_TOOL]} for a in range(10, 30)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "bad.jsonl").write_text(json.dumps({"messages": "hello"}) + "\n")
    with pytest.raises(DatasetError, match=r"bad\.jsonl:1: expected"):
        train_sft(
            tmp_path / "bad.jsonl", tmp_path / "x", sft_settings(Config(), model_name="tiny-llama")
        )
    cfg = load_config(overrides=["model.name=tiny-llama"])
    settings = sft_settings(cfg, epochs=3, lr=1e-2, batch_size=4, eval_fraction=0.2)
    report = train_sft(data, tmp_path / "sft", settings, log=lambda _: None)
    assert report.examples == 16 and report.eval_examples == 4
    assert report.eval_loss < 0.5 * report.eval_loss_before  # held-out assistant tokens
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "sft")
    assert model.generation_config.eos_token_id is not None
    rl = load_config(
        overrides=[
            f"model.name={tmp_path / 'sft'}",
            "model.dtype=float32",
            "env.name=tests.orchestrator.parity_env:ParityEnv",
            "sampler.max_new_tokens=4",
            "rollout.group_size=2",
            "rollout.max_turns=1",
        ]
    )
    run = assemble(rl, "rollout")

    async def one_group() -> list:
        async with run:
            return (await run.engine.collect(1))[0].trajectories

    assert all(t.status == "ok" for t in anyio.run(one_group))
