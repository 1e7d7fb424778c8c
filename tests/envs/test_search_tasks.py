"""search_qa's city questions, held-out split, <search> call format, answer checker, and
its search backends (the real tantivy index; the real HTTP server, up and down)."""

from __future__ import annotations

import socket

import anyio
import pytest

from agentrl.envs import AssistantTurn, make_env
from agentrl.envs.cities import load_cities
from agentrl.envs.search_qa import SearchAnswerVerifier, SearchQAEnv, fewshot_messages
from agentrl.envs.search_tasks import DEFAULT_KINDS, KINDS, split_of
from agentrl.errors import ConfigError
from agentrl.tools import SearchServer, parse_tool_calls
from agentrl.tools.base import ToolCall

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_city_questions_agree_with_the_records() -> None:
    cities = {c.name: c for c in load_cities()}
    assert len(cities) > 25_000
    env = make_env("search_qa", kinds=list(KINDS), size=400)
    for t in env.tasks(seed=3):
        if t["kind"] == "city_country":
            assert cities[t["subject"]].country.name == t["answer"]
        elif t["kind"] == "city_population":
            assert str(cities[t["subject"]].population) == t["answer"]
        elif t["kind"] == "city_to_capital":
            assert cities[t["subject"]].country.capital == t["answer"]
        elif t["kind"] == "bigger_city":
            a, b = (
                t["question"].removeprefix("Which city has more people, ").rstrip("?").split(" or ")
            )
            assert t["answer"] == max(a, b, key=lambda n: cities[n].population)


def test_held_out_split_shares_no_subject_with_train() -> None:
    env = make_env("search_qa", kinds=list(KINDS), size=2000)
    train = {t["subject"] for t in env.tasks("train", seed=0)}
    held = {t["subject"] for t in env.tasks("eval", seed=0)}
    assert train and held and not train & held
    assert all(split_of(s) == "eval" for s in held)
    share = sum(split_of(c.name) == "eval" for c in load_cities()) / len(load_cities())
    assert 0.17 < share < 0.23
    assert {t["kind"] for t in make_env("search_qa", size=200).tasks()} == set(DEFAULT_KINDS)


def test_search_tag_parser() -> None:
    calls, errors = parse_tool_calls("<search> Kaduna </search>", "search_tag")
    assert calls == [ToolCall("search", {"query": "Kaduna"}, "<search> Kaduna </search>")]
    calls, _ = parse_tool_calls("<SEARCH>a</SEARCH> then <search>b</search>", "search_tag")
    assert [c.arguments["query"] for c in calls] == ["a", "b"]
    for text, what in [
        ("<search></search>", "empty"),
        ("<search>Kaduna", "not closed"),
        ("Kaduna</search>", "not opened"),
    ]:
        calls, errors = parse_tool_calls(text, "search_tag")
        assert calls == [] and len(errors) == 1 and what in errors[0]
        assert "<search>your query</search>" in errors[0]  # the expected shape
    assert parse_tool_calls("<answer>Nigeria</answer>", "search_tag") == ([], [])


def test_answer_checker_exact_after_normalisation() -> None:
    v = SearchAnswerVerifier()
    task = {"answer": "Côte d'Ivoire", "answers": ["Côte d'Ivoire", "Ivory Coast"]}
    for text in [
        "<answer>Cote d'Ivoire</answer>",
        "<answer> CÔTE d'ivoire. </answer>",
        "<answer>The Ivory Coast</answer>",
        "\\boxed{IVORY COAST}",
        "<search>x</search> <answer>no</answer> <answer>Ivory Coast</answer>",
    ]:
        assert v.score(text, task)[0] == 1.0, text
    for text in ["<answer>Ivory</answer>", "<answer>Ghana</answer>", "<answer></answer>"]:
        assert v.score(text, task)[0] == 0.0, text
    assert v.score("<answer>1,850,000</answer>", {"answer": "1850000"})[0] == 1.0


async def test_search_tag_episode_results_and_malformed_tags() -> None:
    env = make_env("search_qa", top_k=3).spawn()
    task = next(t for t in env.tasks(seed=0) if t["kind"] == "city_to_capital")
    try:
        messages = await env.reset(task)
        assert messages[0]["role"] == "system" and messages[-1]["content"] == task["question"]
        assert "<search>Tororo</search>" in [m["content"] for m in messages]  # worked example
        result = await env.step(AssistantTurn(f"<search>{task['subject']}</search>", []))
        [obs] = result.observations
        assert obs["role"] == "user" and obs["content"].startswith(
            "<result>\n[1] " + task["subject"]
        )
        assert f"a city in {task['country']}" in obs["content"]
        result = await env.step(AssistantTurn(f"<search>capital of {task['country']}", []))
        assert not result.done and "not closed" in result.observations[0]["content"]
        result = await env.step(AssistantTurn(f"<answer>{task['answer']}</answer>", []))
        assert result.done and result.outcome == 1.0
    finally:
        await env.close()


def test_worked_examples_look_like_the_task_and_are_true() -> None:
    verifier = SearchAnswerVerifier()
    for kind in KINDS:
        shots = fewshot_messages(kind, "search_tag", 3)
        questions = [
            m["content"] for m in shots if m["role"] == "user" and "<result>" not in m["content"]
        ]
        assert len(questions) == 2
        for i, m in enumerate(shots):
            if m["role"] == "assistant" and m["content"].startswith("<answer>"):
                answer = m["content"].removeprefix("<answer>").removesuffix("</answer>")
                assert answer in shots[i - 1]["content"]  # read off the last result
                assert verifier.score(m["content"], {"answer": answer})[0] == 1.0
    city = fewshot_messages("city_population", "search_tag", 3)
    assert city[0]["content"].startswith("What is the population of the city of")


async def test_city_search_finds_the_city_first() -> None:
    index = SearchQAEnv.index()
    cities = load_cities()[::97]  # ~300 cities spread over the alphabet
    misses = [c.name for c in cities if index.search_sync(c.name, 1)[0].title != c.name]
    assert len(misses) <= 0.02 * len(cities), misses[:10]


async def test_http_backend_serves_the_same_results() -> None:
    with SearchServer(SearchQAEnv.index()) as server:
        env = make_env("search_qa", backend="http", search_url=server.url).spawn()
        task = next(iter(env.tasks(seed=0)))
        try:
            await env.reset(task)
            result = await env.step(AssistantTurn(f"<search>{task['subject']}</search>", []))
            [record] = result.info["tool_calls"]
            assert not record.infra_error and f"[1] {task['subject']}" in record.result
        finally:
            await env.close()


def _dead_url() -> str:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/search"


async def test_search_service_down_is_an_infra_error() -> None:
    env = make_env("search_qa", backend="http", search_url=_dead_url(), search_retries=1).spawn()
    task = next(iter(env.tasks(seed=0)))
    try:
        await env.reset(task)
        with anyio.fail_after(20):
            result = await env.step(AssistantTurn("<search>Kaduna</search>", []))
        [record] = result.info["tool_calls"]
        assert record.infra_error and "failed after 2 attempts" in record.error
    finally:
        await env.close()
    with pytest.raises(ConfigError, match="search_url"):
        make_env("search_qa", backend="http")
