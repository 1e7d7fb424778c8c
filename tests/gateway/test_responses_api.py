"""The Responses API driven by the official `openai` client (streaming, function calls,
previous_response_id, errors), and tool_choice required / named on chat completions."""

from __future__ import annotations

import json
from collections.abc import Sequence
from io import StringIO
from typing import Any

import openai
import pytest
from rich.console import Console

from agentrl.commands.rollout import show_trajectory
from agentrl.gateway import Gateway
from agentrl.samplers import Generation, SamplingParams, create_sampler
from agentrl.types import Trajectory, TrajectoryGroup
from tests.gateway.conftest import RecordingSampler, ScriptedSampler, start_gateway

pytestmark = pytest.mark.anyio

TOOLS = [
    {
        "type": "function",
        "name": "calculate",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    }
]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]


def _call(expr: str) -> str:
    body = json.dumps({"name": "calculate", "arguments": {"expression": expr}})
    return f"<tool_call>\n{body}\n</tool_call>"


class StopScripted(ScriptedSampler):
    """Fixed replies cut at the first stop string (kept), as a real sampler stops."""

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        text = self.replies[len(self.calls) % len(self.replies)]
        cuts = [text.find(s) + len(s) for s in params.stop if s in text]
        self.replies[len(self.calls) % len(self.replies)] = text[: min(cuts)] if cuts else text
        return await super().generate(prompt_ids, params)


def _client(gateway: Gateway, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gateway.base_url}/v1", api_key=key, max_retries=0)


def _close(gateway: Gateway, key: str) -> list[Trajectory]:
    template = Trajectory(task_id="t", group_id="g", traj_id="g-0")
    return gateway.close_session(key).trajectories(template)


async def _scripted(tiny: Any, replies: list[str], cls: type = ScriptedSampler) -> Any:
    sampler = cls(create_sampler("hf", model=tiny, max_batch_size=4, seed=0), replies)
    return await start_gateway(sampler), sampler


@pytest.fixture
async def greedy(hf_sampler: RecordingSampler) -> Any:
    server = await start_gateway(hf_sampler, temperature=0.0, max_new_tokens=12)
    yield server.gateway
    await server.close()


async def test_streaming_equals_the_plain_response_at_temperature_0(greedy: Gateway) -> None:
    plain_s, stream_s = greedy.open_session(), greedy.open_session()
    args: dict[str, Any] = {
        "model": "agentrl",
        "instructions": "Be brief.",
        "input": "Count to three.",
        "temperature": 0,
        "include": ["message.output_text.logprobs"],
    }
    async with _client(greedy, plain_s.key) as c:
        plain = await c.responses.create(**args)
    kinds: list[str] = []
    streamed = None
    async with _client(greedy, stream_s.key) as c:
        async for event in await c.responses.create(**args, stream=True):
            kinds.append(event.type)
            if event.type in ("response.completed", "response.incomplete"):
                streamed = event.response
    assert streamed is not None
    assert plain.output_text and streamed.output_text == plain.output_text
    assert streamed.status == plain.status
    assert streamed.usage is not None and plain.usage is not None
    assert streamed.usage.output_tokens == plain.usage.output_tokens
    assert kinds[0] == "response.created" and kinds[-1] in (
        "response.completed",
        "response.incomplete",
    )
    assert "response.output_text.delta" in kinds and "response.output_item.done" in kinds
    (a,), (b,) = _close(greedy, plain_s.key), _close(greedy, stream_s.key)
    assert a.input_ids == b.input_ids
    part = plain.output[0].content[0]  # type: ignore[union-attr]
    assert [e.logprob for e in part.logprobs] == a.segments[-1].logprobs  # type: ignore[union-attr]


async def test_a_function_call_loop_with_full_history_is_token_exact(tiny: Any) -> None:
    server, sampler = await _scripted(
        tiny, [f"Computing.\n{_call('2+3')}<|im_end|>", "5<|im_end|>"]
    )
    gateway = server.gateway
    try:
        session = gateway.open_session()
        items: list[Any] = [{"role": "user", "content": "What is 2 + 3?"}]
        async with _client(gateway, session.key) as c:
            r = await c.responses.create(
                model="gpt-5-codex",
                instructions="Calculator.",
                input=items,
                tools=TOOLS,
                store=False,
            )
            msg, call = r.output
            assert msg.type == "message" and r.output_text == "Computing."
            assert call.type == "function_call" and call.name == "calculate"
            assert json.loads(call.arguments) == {"expression": "2+3"}
            # the Codex way: the whole conversation each time, the output items echoed
            items += [o.model_dump(exclude_none=True) for o in r.output]
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": "5"})
            r2 = await c.responses.create(
                model="gpt-5-codex",
                instructions="Calculator.",
                input=items,
                tools=TOOLS,
                store=False,
            )
            assert r2.output_text == "5" and r2.status == "completed"
        (traj,) = _close(gateway, session.key)
    finally:
        await server.close()
        await sampler.close()
    assert [s.kind for s in traj.segments] == ["prompt", "model", "observation", "model"]
    assert [s.token_ids for s in traj.segments if s.kind == "model"] == [
        g.token_ids for _, g in sampler.calls
    ]
    assert traj.metadata["gateway"]["prefix_breaks"] == 0
    assert traj.metadata["exact_tokens"] is True
    (record,) = traj.turns[0].tool_calls
    assert (record.name, record.result) == ("calculate", "5")


async def test_previous_response_id_continues_the_conversation(
    gateway: Gateway, hf_sampler: RecordingSampler
) -> None:
    session = gateway.open_session(seed=4)
    async with _client(gateway, session.key) as c:
        r = await c.responses.create(model="agentrl", instructions="Be brief.", input="Hello")
        for turn in range(2):
            r = await c.responses.create(
                model="agentrl",
                instructions="Be brief.",
                input=[
                    {"role": "user", "content": [{"type": "input_text", "text": f"more {turn}"}]}
                ],
                previous_response_id=r.id,
            )
        with pytest.raises(openai.BadRequestError) as e:
            await c.responses.create(model="agentrl", input="x", previous_response_id="resp_nope")
        assert e.value.code == "previous_response_not_found"
    (traj,) = _close(gateway, session.key)
    assert [s.kind for s in traj.segments] == ["prompt"] + ["model", "observation"] * 2 + ["model"]
    model = [s for s in traj.segments if s.kind == "model"]
    assert [s.token_ids for s in model] == [g.token_ids for _, g in hf_sampler.calls]
    assert traj.metadata["gateway"]["prefix_breaks"] == 0


async def test_bad_requests_get_openai_shaped_errors(gateway: Gateway) -> None:
    session = gateway.open_session()
    image = {"type": "input_image", "image_url": "https://example.com/cat.png"}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"input": [{"role": "user", "content": [image]}]}, "input.0.content.0"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, "input.0.type"),
        ({"input": "hi", "text": {"format": {"type": "json_object"}}}, "text.format"),
        ({"input": "hi", "extra_body": {"frobnicate": 1}}, "frobnicate"),
        ({"input": "hi", "tool_choice": "required"}, "tool_choice"),
        ({"input": [{"type": "function_call_output", "output": "5"}]}, "input.0.call_id"),
    ]
    async with _client(gateway, session.key) as c:
        for body, param in cases:
            with pytest.raises(openai.BadRequestError) as e:
                await c.responses.create(model="agentrl", **body)
            assert e.value.param == param, (body, e.value.body)
            assert isinstance(e.value.body, dict) and e.value.body["message"]
    async with _client(gateway, "sk-nobody") as c:
        with pytest.raises(openai.AuthenticationError):
            await c.responses.create(model="agentrl", input="hi")


async def test_chat_tool_choice_required_yields_a_call(tiny: Any) -> None:
    """smolagents' ToolCallingAgent sends tool_choice='required' on every call."""
    reply = '{"name": "calculate", "arguments": {"expression": "6*7"}}\n</tool_call><|im_end|>'
    server, sampler = await _scripted(tiny, [reply])
    gateway = server.gateway
    try:
        session = gateway.open_session()
        async with _client(gateway, session.key) as c:
            r = await c.chat.completions.create(
                model="agentrl",
                messages=[{"role": "user", "content": "6*7?"}],
                tools=CHAT_TOOLS,  # type: ignore[arg-type]
                tool_choice="required",
            )
        (traj,) = _close(gateway, session.key)
    finally:
        await server.close()
        await sampler.close()
    (call,) = r.choices[0].message.tool_calls or []
    assert r.choices[0].finish_reason == "tool_calls"
    assert json.loads(call.function.arguments) == {"expression": "6*7"}  # type: ignore[union-attr]
    forced = tiny[1].encode("<tool_call>\n", add_special_tokens=False)
    assert sampler.calls[0][0][-len(forced) :] == forced
    assert traj.segments[1].forced == len(forced)


async def test_chat_tool_choice_required_on_the_real_model_is_recorded_exactly(
    gateway: Gateway, hf_sampler: RecordingSampler
) -> None:
    session = gateway.open_session(seed=5)
    async with _client(gateway, session.key) as c:
        await c.chat.completions.create(
            model="agentrl",
            messages=[{"role": "user", "content": "6*7?"}],
            tools=CHAT_TOOLS,  # type: ignore[arg-type]
            tool_choice={"type": "function", "function": {"name": "calculate"}},
            max_tokens=40,
        )
    (traj,) = _close(gateway, session.key)
    prompt, gen = hf_sampler.calls[0]
    model = traj.segments[1]
    n = model.forced or 0
    opening = '<tool_call>\n{"name": "calculate", "arguments": '
    assert n > 0 and tiny_decode(gateway, model.token_ids[:n]) == opening
    assert prompt == traj.segments[0].token_ids + model.token_ids[:n]
    assert model.token_ids[n:] == gen.token_ids and model.logprobs[n:] == gen.logprobs
    assert sum(traj.loss_mask) == len(gen.token_ids)
    out = StringIO()
    show_trajectory(Console(file=out, width=200), TrajectoryGroup("t", [traj]), traj)
    assert f"{len(gen.token_ids)} trained tokens after {n} forced" in out.getvalue()


def tiny_decode(gateway: Gateway, ids: list[int]) -> str:
    return gateway.tokenizer.decode(ids, skip_special_tokens=False)


async def test_parallel_tool_calls_false_stops_after_the_first_call(tiny: Any) -> None:
    two = f"{_call('1+1')}\n{_call('2+2')}<|im_end|>"
    server, sampler = await _scripted(tiny, [two, "done<|im_end|>"], StopScripted)
    gateway = server.gateway
    try:
        session = gateway.open_session()
        items: list[Any] = [{"role": "user", "content": "sums"}]
        async with _client(gateway, session.key) as c:
            r = await c.responses.create(
                model="agentrl", input=items, tools=TOOLS, parallel_tool_calls=False
            )
            (call,) = r.output
            assert call.type == "function_call" and json.loads(call.arguments) == {
                "expression": "1+1"
            }
            r2 = await c.responses.create(
                model="agentrl",
                input=[{"type": "function_call_output", "call_id": call.call_id, "output": "2"}],
                tools=TOOLS,
                parallel_tool_calls=False,
                previous_response_id=r.id,
            )
            assert r2.output_text == "done"
        (traj,) = _close(gateway, session.key)
    finally:
        await server.close()
        await sampler.close()
    assert traj.metadata["gateway"]["prefix_breaks"] == 0
    # the turn the stop cut short is closed by the template, in the masked observation
    assert tiny[1].decode(traj.segments[2].token_ids).startswith("<|im_end|>")
