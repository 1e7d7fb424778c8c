"""The gateway driven by the official `openai` client: token-exact recording, tool calls,
streaming, prefix breaks, weight updates mid-call, many sessions, and bad requests."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import openai
import pytest

from agentrl.gateway import Gateway
from agentrl.types import Trajectory, TrajectoryGroup
from tests.gateway.conftest import RecordingSampler, ScriptedSampler, start_gateway
from tests.waiting import wait_until_async

pytestmark = pytest.mark.anyio

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
SYSTEM = {"role": "system", "content": "You are a calculator agent."}


_OPEN: list[openai.AsyncOpenAI] = []


@pytest.fixture(autouse=True)
async def _close_clients() -> Any:
    yield
    while _OPEN:
        await _OPEN.pop().close()


def _client(gateway: Gateway, session: Any) -> openai.AsyncOpenAI:
    client = openai.AsyncOpenAI(
        base_url=gateway.session_url(session), api_key="unused", max_retries=0
    )
    _OPEN.append(client)
    return client


def _close(gateway: Gateway, session: Any) -> list[Trajectory]:
    template = Trajectory(task_id="t", group_id="g", traj_id="g-0")
    return gateway.close_session(session.key).trajectories(template)


async def test_a_multi_turn_conversation_is_one_token_exact_trajectory(
    gateway: Gateway, hf_sampler: RecordingSampler
) -> None:
    session = gateway.open_session(seed=3)
    client = _client(gateway, session)
    messages: list[Any] = [SYSTEM, {"role": "user", "content": "What is 2 + 3?"}]
    for turn in range(3):
        r = await client.chat.completions.create(
            model="agentrl", messages=messages, tools=TOOLS, logprobs=True
        )
        messages.append(r.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": f"Follow-up {turn}: are you sure?"})
    (traj,) = _close(gateway, session)

    assert [s.kind for s in traj.segments] == ["prompt"] + ["model", "observation"] * 2 + ["model"]
    model = [s for s in traj.segments if s.kind == "model"]
    # exactly the sampler's ids, log-probs and versions, in order
    assert [s.token_ids for s in model] == [g.token_ids for _, g in hf_sampler.calls]
    assert [s.logprobs for s in model] == [g.logprobs for _, g in hf_sampler.calls]
    assert [s.versions for s in model] == [g.versions for _, g in hf_sampler.calls]
    # each call's prompt was the trajectory so far: nothing re-tokenised
    ids = traj.input_ids
    for prompt, _ in hf_sampler.calls:
        assert ids[: len(prompt)] == prompt
    # trained exactly on the sampled tokens; the follow-ups are masked
    mask = traj.loss_mask
    assert sum(mask) == sum(len(s) for s in model)
    pos = 0
    for seg in traj.segments:
        assert set(mask[pos : pos + len(seg)]) <= ({1} if seg.kind == "model" else {0})
        pos += len(seg)
    assert traj.metadata["gateway"]["prefix_breaks"] == 0
    assert r.choices[0].logprobs is not None
    assert [e.logprob for e in r.choices[0].logprobs.content] == model[-1].logprobs


async def test_tool_calls_come_back_as_openai_tool_calls_and_results_are_masked(
    tiny: Any,
) -> None:
    from agentrl.samplers import create_sampler

    inner = create_sampler("hf", model=tiny, max_batch_size=4, seed=0)
    call = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2+3"}}\n</tool_call>'
    sampler = ScriptedSampler(inner, [f"Let me compute.\n{call}<|im_end|>", "\\boxed{5}<|im_end|>"])
    server = await start_gateway(sampler)
    gateway = server.gateway
    try:
        session = gateway.open_session()
        client = _client(gateway, session)
        messages: list[Any] = [SYSTEM, {"role": "user", "content": "What is 2 + 3?"}]
        r = await client.chat.completions.create(model="agentrl", messages=messages, tools=TOOLS)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == "Let me compute."
        (tc,) = choice.message.tool_calls
        assert tc.function.name == "calculate"
        assert json.loads(tc.function.arguments) == {"expression": "2+3"}
        messages.append(choice.message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": tc.id, "content": "5"})
        r2 = await client.chat.completions.create(model="agentrl", messages=messages, tools=TOOLS)
        assert r2.choices[0].message.content == "\\boxed{5}"
        assert r2.choices[0].finish_reason == "stop"
        (traj,) = _close(gateway, session)
    finally:
        await server.close()
        await inner.close()
    kinds = [s.kind for s in traj.segments]
    assert kinds == ["prompt", "model", "observation", "model"]
    tok = tiny[1]
    # the model's own tool-call text is what was trained (not the agent's JSON copy)
    assert traj.segments[1].token_ids == sampler.calls[0][1].token_ids
    observation = tok.decode(traj.segments[2].token_ids)
    assert "<tool_response>\n5\n</tool_response>" in observation
    assert "calculate" in tok.decode(traj.segments[0].token_ids)  # tools in the prompt
    assert traj.metadata["exact_tokens"] is True
    (record,) = traj.turns[0].tool_calls
    assert (record.name, record.arguments, record.result) == (
        "calculate",
        {"expression": "2+3"},
        "5",
    )


async def test_streaming_returns_the_same_tokens_as_non_streaming(
    hf_sampler: RecordingSampler,
) -> None:
    # at temperature 0, as the Messages and Responses tests: a seeded draw at temperature 1
    # from the tiny random model (a near-uniform 49k-way choice) differed once in 4 loaded
    # runs; greedy decoding compares the streaming path, not the sampler's draws
    server = await start_gateway(hf_sampler, temperature=0.0)
    gateway = server.gateway
    try:
        messages = [SYSTEM, {"role": "user", "content": "Count to three."}]
        plain_session, stream_session = gateway.open_session(), gateway.open_session()
        plain = await _client(gateway, plain_session).chat.completions.create(
            model="agentrl", messages=messages, temperature=0, logprobs=True, max_tokens=12
        )
        stream = await _client(gateway, stream_session).chat.completions.create(
            model="agentrl",
            messages=messages,
            temperature=0,
            logprobs=True,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
        content, tokens, finish, usage = "", [], None, None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                content += c.delta.content or ""
                tokens += [e.token for e in (c.logprobs.content if c.logprobs else None) or []]
                finish = c.finish_reason or finish
        assert content == plain.choices[0].message.content
        assert tokens == [e.token for e in plain.choices[0].logprobs.content]
        assert finish == plain.choices[0].finish_reason
        assert usage is not None and usage.completion_tokens == plain.usage.completion_tokens
        (a,), (b,) = _close(gateway, plain_session), _close(gateway, stream_session)
        assert a.input_ids == b.input_ids
    finally:
        await server.close()


async def test_a_rewritten_history_starts_a_new_sample_and_is_counted(gateway: Gateway) -> None:
    from io import StringIO

    from rich.console import Console

    from agentrl.commands.rollout import show_trajectory

    session = gateway.open_session(seed=1)
    client = _client(gateway, session)
    messages: list[Any] = [SYSTEM, {"role": "user", "content": "Hi"}]
    r = await client.chat.completions.create(model="agentrl", messages=messages)
    messages.append({"role": "assistant", "content": "I rewrote this reply."})
    messages.append({"role": "user", "content": "Go on"})
    await client.chat.completions.create(model="agentrl", messages=messages)
    assert r.choices[0].message.content != "I rewrote this reply."
    first, second = _close(gateway, session)
    assert first.traj_id == "g-0" and second.traj_id == "g-0.s1"
    meta = second.metadata["gateway"]
    assert meta["prefix_breaks"] == 1 and meta["samples"] == 2
    assert meta["started_by"] == "prefix break: the agent changed the model's reply (message 2)"
    assert [s.kind for s in second.segments] == ["prompt", "model"]  # rendered whole, masked
    assert gateway.stats.prefix_breaks == 1
    out = StringIO()
    show_trajectory(Console(file=out, width=120), TrajectoryGroup("t", [first, second]), second)
    assert "prefix break" in out.getvalue()


async def test_n_choices_become_samples_of_the_group(gateway: Gateway) -> None:
    session = gateway.open_session(seed=5)
    r = await _client(gateway, session).chat.completions.create(
        model="agentrl", messages=[SYSTEM, {"role": "user", "content": "Hi"}], n=3
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    trajs = _close(gateway, session)
    assert len(trajs) == 3
    assert len({tuple(t.segments[0].token_ids) for t in trajs}) == 1  # one prompt
    assert [t.metadata["gateway"]["started_by"] for t in trajs[1:]] == [
        "choice 2 of 3",
        "choice 3 of 3",
    ]


async def test_completions_api_extends_by_token_ids(gateway: Gateway) -> None:
    session = gateway.open_session(seed=2)
    client = _client(gateway, session)
    tok = gateway.tokenizer
    prompt = tok.encode("The answer is", add_special_tokens=False)
    first = await client.completions.create(model="agentrl", prompt=prompt, max_tokens=5)
    sampled = session.samples[0].segments[1].token_ids
    follow = prompt + sampled + tok.encode(" Next:", add_special_tokens=False)
    await client.completions.create(model="agentrl", prompt=follow, max_tokens=5)
    (traj,) = _close(gateway, session)
    assert [s.kind for s in traj.segments] == ["prompt", "model", "observation", "model"]
    assert traj.input_ids[: len(follow)] == follow
    assert first.choices[0].text == tok.decode(sampled, skip_special_tokens=True)


async def test_a_weight_update_mid_call_waits_and_tags_versions(
    gateway: Gateway, hf_sampler: RecordingSampler, tiny: Any
) -> None:
    import torch

    state = {k: v.clone() for k, v in tiny[0].state_dict().items()}
    with torch.no_grad():
        for v in state.values():
            v.mul_(1.01)
    sessions = [gateway.open_session(seed=i) for i in range(8)]
    results: list[Any] = []

    async def agent(session: Any) -> None:
        r = await _client(gateway, session).chat.completions.create(
            model="agentrl", messages=[SYSTEM, {"role": "user", "content": "Hi"}], max_tokens=48
        )
        results.append(r)

    async with anyio.create_task_group() as tg:
        for s in sessions:
            tg.start_soon(agent, s)
        # the swap lands while sequences are decoding (the sampler's active count)
        await wait_until_async(
            lambda: hf_sampler.inner.stats()["active"] > 0, "calls decoding", interval=0.002
        )
        await hf_sampler.update_weights(state, 1)
    assert len(results) == 8  # every call finished; none failed during the swap
    versions = {v for s in sessions for t in _close(gateway, s) for v in t.versions if v >= 0}
    assert 1 in versions
    after = gateway.open_session()
    await _client(gateway, after).chat.completions.create(
        model="agentrl", messages=[SYSTEM, {"role": "user", "content": "Hi"}]
    )
    assert set(_close(gateway, after)[0].segments[1].versions) == {1}


@pytest.mark.slow
async def test_256_concurrent_sessions_never_mix(gateway: Gateway) -> None:
    n = 256
    sessions = [gateway.open_session(seed=i) for i in range(n)]
    http = openai.DefaultAsyncHttpxClient(limits=httpx.Limits(max_connections=512))

    async def agent(i: int) -> None:
        client = openai.AsyncOpenAI(
            base_url=gateway.session_url(sessions[i]),
            api_key="x",
            http_client=http,
            max_retries=0,
        )
        messages: list[Any] = [{"role": "user", "content": f"agent {i} speaking"}]
        for turn in range(2):
            r = await client.chat.completions.create(
                model="agentrl", messages=messages, max_tokens=4
            )
            messages.append(r.choices[0].message.model_dump(exclude_none=True))
            messages.append({"role": "user", "content": f"agent {i} turn {turn}"})

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(agent, i)
    await http.aclose()
    tok = gateway.tokenizer
    for i, session in enumerate(sessions):
        (traj,) = _close(gateway, session)  # one trajectory each: no break, no mixing
        prompt = tok.decode(traj.segments[0].token_ids)
        assert f"agent {i} speaking" in prompt
        assert f"agent {i} turn 0" in tok.decode(traj.segments[2].token_ids)
        assert len([s for s in traj.segments if s.kind == "model"]) == 2
    assert gateway.sessions == {}  # nothing kept after the episodes end
    assert gateway.stats.calls == 2 * n


async def test_bad_requests_get_openai_shaped_errors(gateway: Gateway) -> None:
    session = gateway.open_session()
    url = gateway.session_url(session)
    ok = {"model": "agentrl", "messages": [{"role": "user", "content": "hi"}]}
    long = "word " * 9000
    cases = [
        ({"model": "agentrl"}, 400, "messages", "missing_required_parameter"),
        ({**ok, "n": 99}, 400, "n", "invalid_value"),
        (
            {**ok, "tools": [{"type": "function", "function": {"name": "bad name!"}}]},
            400,
            None,
            None,
        ),
        ({**ok, "tools": [{"type": "function"}]}, 400, "tools.0.function", None),
        (
            {**ok, "messages": [{"role": "user", "content": long}]},
            400,
            "messages",
            "context_length_exceeded",
        ),
        ({**ok, "temperature": 0.3}, 400, "temperature", "invalid_value"),
        ({**ok, "logit_bias": {"1": 5}}, 400, "logit_bias", "unsupported_parameter"),
        ({**ok, "frobnicate": True}, 400, "frobnicate", "unsupported_parameter"),
        ({**ok, "tool_choice": "required"}, 400, "tool_choice", None),  # no tools to call
        ({**ok, "tool_choice": "sometimes"}, 400, "tool_choice", "unsupported_parameter"),
        ({**ok, "messages": []}, 400, "messages", "invalid_value"),
    ]
    async with httpx.AsyncClient(base_url=url) as http:
        for body, status, param, code in cases:
            r = await http.post("/chat/completions", json=body)
            assert r.status_code == status, (body, r.text)
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"}
            assert err["message"]
            if param is not None:
                assert err["param"] == param, (body, err)
            if code is not None:
                assert err["code"] == code, (body, err)
        r = await http.post("/chat/completions", content=b"{not json")
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        r = await http.get("/nowhere")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    async with httpx.AsyncClient(base_url=gateway.base_url) as http:
        r = await http.post("/v1/chat/completions", json=ok, headers={"Authorization": "Bearer no"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = await http.post(
            "/v1/chat/completions", json=ok, headers={"Authorization": f"Bearer {session.key}"}
        )
        assert r.status_code == 200  # the key alone selects the session, too
    # the official client raises its typed errors from these bodies
    client = _client(gateway, session)
    with pytest.raises(openai.BadRequestError) as e:
        await client.chat.completions.create(model="agentrl", messages=ok["messages"], n=99)
    assert e.value.param == "n"
    models = await client.models.list()
    assert [m.id for m in models.data] == ["agentrl"]


async def test_limits_refuse_calls_and_mark_the_episode_truncated(
    hf_sampler: RecordingSampler,
) -> None:
    server = await start_gateway(hf_sampler)
    gateway = server.gateway
    try:
        session = gateway.open_session(max_calls=1)
        client = _client(gateway, session)
        messages = [{"role": "user", "content": "hi"}]
        await client.chat.completions.create(model="agentrl", messages=messages)
        with pytest.raises(openai.BadRequestError) as e:
            await client.chat.completions.create(model="agentrl", messages=messages)
        assert e.value.code == "turn_limit_reached"
        (traj,) = _close(gateway, session)
        assert traj.status == "truncated"
    finally:
        await server.close()
    with pytest.raises(openai.APIConnectionError):  # closed: nothing listens any more
        await client.chat.completions.create(model="agentrl", messages=messages)


async def test_any_model_name_reaches_the_policy_and_is_recorded(
    hf_sampler: RecordingSampler,
) -> None:
    """An agent written for another API keeps its model name; strict_model keeps the 404."""
    server = await start_gateway(hf_sampler)
    try:
        gateway = server.gateway
        session = gateway.open_session()
        client = _client(gateway, session)
        messages = [{"role": "user", "content": "hi"}]
        r = await client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        assert r.model == "gpt-4o-mini"  # echoed as OpenAI does
        messages.append(r.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": "again"})
        await client.chat.completions.create(model="agentrl", messages=messages)
        (traj,) = _close(gateway, session)  # the two names did not break the conversation
        assert traj.metadata["gateway"]["models"] == {"gpt-4o-mini": 1, "agentrl": 1}
        assert traj.metadata["gateway"]["prefix_breaks"] == 0
        assert len(hf_sampler.calls) == 2  # both went to the policy
    finally:
        await server.close()
    strict = await start_gateway(hf_sampler, strict_model=True)
    try:
        session = strict.gateway.open_session()
        client = _client(strict.gateway, session)
        with pytest.raises(openai.NotFoundError) as e:
            await client.chat.completions.create(model="gpt-4o-mini", messages=messages[:1])
        assert e.value.code == "model_not_found" and "strict_model" in str(e.value)
        r = await client.chat.completions.create(model="agentrl", messages=messages[:1])
        assert r.choices[0].message.content is not None
        strict.gateway.close_session(session.key)
    finally:
        await strict.close()
