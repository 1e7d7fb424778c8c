"""examples/calculator_agent_warmstart.py: its demonstrations are the agent's own
conversations, token for token as the gateway renders and parses them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))

import calculator_agent as agent  # noqa: E402
import calculator_agent_warmstart as warmstart  # noqa: E402


def test_demonstrations_are_the_agents_conversations_as_the_gateway_renders_them(
    tmp_path: Path,
) -> None:
    from agentrl.chat import ChatRenderer
    from agentrl.config import load_config
    from agentrl.gateway.convert import reply_from_text
    from agentrl.models import load_tokenizer
    from agentrl.training.sft import encode_transcript

    n = warmstart.write_demos(tmp_path / "demos.jsonl", 12)
    rows = [json.loads(line) for line in (tmp_path / "demos.jsonl").read_text().splitlines()]
    assert n == len(rows) == 12
    cfg = load_config(REPO / "examples" / "calculator_agent.yaml")
    renderer = ChatRenderer(
        load_tokenizer("tiny-llama"), tools=agent.TOOLS, template=cfg.model.chat_template
    )
    questions = set()
    for row in rows:
        messages = row["messages"]
        assert row["tools"] == agent.TOOLS
        assert messages[0] == {"role": "system", "content": agent.SYSTEM}
        questions.add(messages[1]["content"])
        example = encode_transcript(renderer, messages, "demo")
        # the prompt is what the gateway sends the sampler for the agent's first call
        prompt = renderer.prompt_ids(messages[:2])
        assert example.input_ids[: len(prompt)] == prompt
        assert not any(example.loss_mask[: len(prompt)])
        # the trained tool-call turn parses, through the gateway's parser, into a call the
        # agent runs, and the tool's answer is the one the boxed reply repeats
        first = len(prompt) + example.loss_mask[len(prompt) :].index(0)
        text = renderer.decode(example.input_ids[len(prompt) : first])
        reply = reply_from_text(text.removesuffix("<|im_end|>"), parse_tools=True)
        (call,) = reply.tool_calls
        assert call["function"]["name"] == "calculate"
        expression = json.loads(call["function"]["arguments"])["expression"]
        assert agent.calculate(expression) == messages[3]["content"]
        assert messages[4]["content"] == f"\\boxed{{{messages[3]['content']}}}"
    assert len(questions) == 12


def test_expression_of_a_code_math_question() -> None:
    assert warmstart.expression_of("Calculate -( -46 + 330 ).") == "-( -46 + 330 )"
    assert warmstart.demonstration({"question": "Calculate 7 / 2.", "answer": "4"}) is None
