"""The environments' first messages render with the real SmolLM2 tokenizer and the
Hermes tool template, and leave room in a small model's context."""

from __future__ import annotations

from typing import Any

import pytest

from agentrl.envs import make_env


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from agentrl.models import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("code_math", {"fewshot": "system", "call_format": "tool_call"}),
        ("code_math", {"fewshot": "messages", "call_format": "tool_call"}),
        ("search_qa", {"call_format": "tool_call"}),  # Hermes: the tool list in the prompt
    ],
)
async def test_prompt_renders_with_tools(tokenizer: Any, name: str, options: dict) -> None:
    from agentrl.chat import ChatRenderer

    env = make_env(name, size=1, **options).spawn()
    task = next(env.tasks())
    messages = await env.reset(task)
    await env.close()
    renderer = ChatRenderer(tokenizer, tools=env.tool_schemas())
    ids = renderer.prompt_ids(messages)
    text = tokenizer.decode(ids)
    assert f'"name": "{env.tools[0].name}"' in text  # the tool list is in the system turn
    assert text.rstrip().endswith("<|im_start|>assistant")
    assert task["question"] in text
    assert len(ids) < 900, len(ids)  # room left for turns in a 2048-token context


@pytest.mark.anyio
@pytest.mark.parametrize("fewshot", ["system", "messages"])
async def test_code_format_prompt_has_no_tool_section(tokenizer: Any, fewshot: str) -> None:
    from agentrl.chat import ChatRenderer

    env = make_env("code_math", size=1, fewshot=fewshot).spawn()
    task = next(env.tasks())
    messages = await env.reset(task)
    await env.close()
    text = tokenizer.decode(ChatRenderer(tokenizer, tools=env.tool_schemas()).prompt_ids(messages))
    assert (
        "<tools>" not in text and "<tool_call>" not in text and text.count("```python") == 3
    )  # format line + 2 examples
    assert text.rstrip().endswith("<|im_start|>assistant") and task["question"] in text
