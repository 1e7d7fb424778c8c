"""The Messages API driven by the official `anthropic` client: streaming equals the plain
answer, a tool loop is one token-exact trajectory, forced tool use, Anthropic-shaped errors."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest

from agentrl.gateway import Gateway
from agentrl.samplers import create_sampler
from agentrl.types import Trajectory
from tests.gateway.conftest import RecordingSampler, ScriptedSampler, start_gateway

pytestmark = pytest.mark.anyio

TOOLS = [
    {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression.",
        "input_schema": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    }
]
SYSTEM = [
    {"type": "text", "text": "You are a calculator agent.", "cache_control": {"type": "ephemeral"}}
]
CALL = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2+3"}}\n</tool_call>'


def _client(gateway: Gateway, key: str) -> anthropic.AsyncAnthropic:
    # the key travels as x-api-key, the way Claude Code and the SDK send it
    return anthropic.AsyncAnthropic(base_url=gateway.base_url, api_key=key, max_retries=0)


def _close(gateway: Gateway, key: str) -> list[Trajectory]:
    template = Trajectory(task_id="t", group_id="g", traj_id="g-0")
    return gateway.close_session(key).trajectories(template)


@pytest.fixture
async def greedy(hf_sampler: RecordingSampler) -> Any:
    server = await start_gateway(hf_sampler, temperature=0.0, max_new_tokens=12)
    yield server.gateway
    await server.close()


async def test_streaming_equals_the_plain_message_at_temperature_0(greedy: Gateway) -> None:
    messages = [{"role": "user", "content": "Count to three."}]
    plain_s, stream_s = greedy.open_session(), greedy.open_session()
    async with _client(greedy, plain_s.key) as c:
        plain = await c.messages.create(
            model="agentrl", system=SYSTEM, messages=messages, max_tokens=12
        )
    events: list[str] = []
    async with (
        _client(greedy, stream_s.key) as c,
        c.messages.stream(
            model="agentrl", system=SYSTEM, messages=messages, max_tokens=12
        ) as stream,
    ):
        async for event in stream:
            events.append(event.type)
        streamed = await stream.get_final_message()
    assert plain.content and plain.content[0].type == "text"
    assert streamed.content[0].text == plain.content[0].text
    assert streamed.stop_reason == plain.stop_reason and plain.stop_reason in (
        "end_turn",
        "max_tokens",
    )
    assert streamed.usage.output_tokens == plain.usage.output_tokens
    assert streamed.usage.input_tokens == plain.usage.input_tokens
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "content_block_start" in events and "message_delta" in events
    (a,), (b,) = _close(greedy, plain_s.key), _close(greedy, stream_s.key)
    assert a.input_ids == b.input_ids


async def test_a_text_conversation_is_one_token_exact_trajectory(
    gateway: Gateway, hf_sampler: RecordingSampler
) -> None:
    session = gateway.open_session(seed=2)
    messages: list[Any] = [{"role": "user", "content": "Hello"}]
    async with _client(gateway, session.key) as c:
        for turn in range(3):
            r = await c.messages.create(
                model="agentrl", system="Be brief.", messages=messages, max_tokens=8
            )
            messages.append({"role": "assistant", "content": [b.model_dump() for b in r.content]})
            messages.append({"role": "user", "content": [{"type": "text", "text": f"more {turn}"}]})
    (traj,) = _close(gateway, session.key)
    model = [s for s in traj.segments if s.kind == "model"]
    assert [s.token_ids for s in model] == [g.token_ids for _, g in hf_sampler.calls]
    assert [s.logprobs for s in model] == [g.logprobs for _, g in hf_sampler.calls]
    for prompt, _ in hf_sampler.calls:
        assert traj.input_ids[: len(prompt)] == prompt
    assert traj.metadata["gateway"]["prefix_breaks"] == 0


async def _scripted(tiny: Any, replies: list[str]) -> tuple[Any, ScriptedSampler]:
    inner = create_sampler("hf", model=tiny, max_batch_size=4, seed=0)
    sampler = ScriptedSampler(inner, replies)
    return await start_gateway(sampler), sampler


async def test_a_tool_use_round_trip_is_token_exact(tiny: Any) -> None:
    server, sampler = await _scripted(tiny, [f"Let me compute.\n{CALL}<|im_end|>", "5<|im_end|>"])
    gateway = server.gateway
    try:
        session = gateway.open_session()
        messages: list[Any] = [{"role": "user", "content": "What is 2 + 3?"}]
        async with _client(gateway, session.key) as c:
            r = await c.messages.create(
                model="claude-test",
                system=SYSTEM,
                messages=messages,
                tools=TOOLS,
                max_tokens=64,
            )
            assert r.stop_reason == "tool_use"
            text, use = r.content
            assert text.type == "text" and text.text == "Let me compute."
            assert use.type == "tool_use" and use.name == "calculate"
            assert use.input == {"expression": "2+3"} and use.id.startswith("toolu_")
            messages.append({"role": "assistant", "content": [b.model_dump() for b in r.content]})
            result = {
                "type": "tool_result",
                "tool_use_id": use.id,
                "content": [{"type": "text", "text": "5"}],
            }
            messages.append({"role": "user", "content": [result]})
            r2 = await c.messages.create(
                model="claude-test",
                system=SYSTEM,
                messages=messages,
                tools=TOOLS,
                max_tokens=64,
            )
            assert r2.stop_reason == "end_turn" and r2.content[0].text == "5"
        (traj,) = _close(gateway, session.key)
    finally:
        await server.close()
        await sampler.close()
    assert [s.kind for s in traj.segments] == ["prompt", "model", "observation", "model"]
    assert traj.segments[1].token_ids == sampler.calls[0][1].token_ids
    assert traj.metadata["gateway"]["prefix_breaks"] == 0
    assert traj.metadata["exact_tokens"] is True
    assert "<tool_response>\n5\n</tool_response>" in tiny[1].decode(traj.segments[2].token_ids)
    (record,) = traj.turns[0].tool_calls
    assert (record.name, record.result) == ("calculate", "5")
    assert traj.metadata["gateway"]["models"] == {"claude-test": 2}


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "calculate"}])
async def test_tool_choice_any_and_tool_force_a_call(tiny: Any, choice: dict[str, Any]) -> None:
    named = choice["type"] == "tool"
    rest = '{"expression": "1+1"}}\n</tool_call><|im_end|>'
    reply = rest if named else '{"name": "calculate", "arguments": ' + rest
    server, sampler = await _scripted(tiny, [reply])
    gateway = server.gateway
    try:
        session = gateway.open_session()
        async with _client(gateway, session.key) as c:
            r = await c.messages.create(
                model="agentrl",
                messages=[{"role": "user", "content": "1+1?"}],
                tools=TOOLS,
                tool_choice=choice,
                max_tokens=64,
            )
        (traj,) = _close(gateway, session.key)
    finally:
        await server.close()
        await sampler.close()
    (use,) = r.content
    assert use.type == "tool_use" and use.input == {"expression": "1+1"}
    opening = "<tool_call>\n" + ('{"name": "calculate", "arguments": ' if named else "")
    forced = tiny[1].encode(opening, add_special_tokens=False)
    prompt, gen = sampler.calls[0]
    assert prompt[-len(forced) :] == forced  # the model continued the forced opening
    model = traj.segments[1]
    assert model.forced == len(forced)
    assert model.token_ids == forced + gen.token_ids
    assert model.logprobs == [0.0] * len(forced) + gen.logprobs
    start = len(traj.segments[0])
    mask = traj.loss_mask[start : start + len(model)]
    assert mask == [0] * len(forced) + [1] * len(gen.token_ids)  # forced tokens are not trained


async def test_count_tokens_is_the_prompt_the_call_is_sampled_after(gateway: Gateway) -> None:
    session = gateway.open_session()
    body = {
        "model": "agentrl",
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Hi"}],
    }
    async with _client(gateway, session.key) as c:
        counted = await c.messages.count_tokens(**body, tools=TOOLS)
        r = await c.messages.create(**body, tools=TOOLS, max_tokens=4)
    assert counted.input_tokens == r.usage.input_tokens > 0
    assert len(_close(gateway, session.key)) == 1  # counting recorded nothing


async def test_bad_requests_get_anthropic_shaped_errors(gateway: Gateway) -> None:
    session = gateway.open_session()
    ok = {"model": "agentrl", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
    }
    cases = [
        ({k: v for k, v in ok.items() if k != "max_tokens"}, 400, "max_tokens"),
        ({**ok, "messages": [{"role": "user", "content": [image]}]}, 400, "messages.0.content.0"),
        (
            {
                **ok,
                "tools": [
                    {"type": "web_search_20250305", "name": "web_search", "input_schema": {}}
                ],
            },
            400,
            "tools.0.type",
        ),
        ({**ok, "tool_choice": {"type": "tool", "name": "nope"}}, 400, "tool_choice"),
        ({**ok, "thinking": {"type": "enabled", "budget_tokens": 1024}}, 400, "thinking"),
        ({**ok, "frobnicate": 1}, 400, "frobnicate"),
        ({**ok, "messages": [{"role": "system", "content": "x"}]}, 400, "messages.0.role"),
    ]
    headers = {"x-api-key": session.key, "anthropic-version": "2023-06-01"}
    async with httpx.AsyncClient(base_url=gateway.base_url, headers=headers) as http:
        for body, status, names in cases:
            r = await http.post("/v1/messages", json=body)
            assert r.status_code == status, (body, r.text)
            got = r.json()
            assert got["type"] == "error" and got["error"]["type"] == "invalid_request_error"
            assert names in got["error"]["message"], (body, got)
        r = await http.post("/v1/messages", content=b"{not json")
        assert r.status_code == 400 and r.json()["type"] == "error"
        r = await http.post("/v1/messages", json=ok, headers={"x-api-key": "nobody"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    async with _client(gateway, session.key) as c:
        with pytest.raises(anthropic.BadRequestError) as e:
            await c.messages.create(
                model="agentrl", max_tokens=8, messages=[{"role": "user", "content": [image]}]
            )  # type: ignore[list-item]
        assert "image" in e.value.message
    async with _client(gateway, "sk-unknown") as c:
        with pytest.raises(anthropic.AuthenticationError):
            await c.messages.create(**ok)  # type: ignore[arg-type]
