"""search_qa: the country corpus, its questions, retrieval through the real tantivy index
(countries and cities) with the Hermes call format, and the exact-match reward."""

from __future__ import annotations

import json
import re
import time

import anyio
import pytest

from agentrl.envs import AssistantTurn, make_env
from agentrl.envs.countries import KINDS, MULTI_HOP, SINGLE_HOP, load_countries, question_bank
from agentrl.envs.search_qa import SearchQAEnv
from agentrl.errors import ConfigError
from agentrl.tools import LocalSearchIndex


def search_calls(queries: list[str]) -> str:
    return "\n".join(
        "<tool_call>\n"
        + json.dumps({"name": "search", "arguments": {"query": q}})
        + "\n</tool_call>"
        for q in queries
    )


def titles(observation: str) -> list[str]:
    """Titles of the hits in a search observation, best first."""
    return re.findall(r"^\[\d+\] (.+)$", observation, re.M)


def bridge_query(question: str) -> str:
    """The first hop of a multi-hop question, as a searcher would phrase it."""
    m = re.search(r"capital is (.+)\?$", question)
    if m:
        return f"capital {m.group(1)}"
    m = re.search(r"borders both (.+) and (.+)\?$", question)
    assert m, question
    return f"borders {m.group(1)} {m.group(2)}"


def test_corpus_and_questions_are_consistent() -> None:
    countries = {c.name: c for c in load_countries()}
    assert len(countries) >= 250
    france = countries["France"].document()
    assert france["title"] == "France" and "Paris" in france["text"] and "EUR" in france["text"]
    bank = question_bank().by_kind
    assert all(bank[k] for k in KINDS)
    for q in bank["capital"]:
        assert countries[q["country"]].capital == q["answer"]
    for q in bank["capital_to_currency"]:
        cap = q["question"].split("capital is ")[1].rstrip("?")
        owners = [c for c in countries.values() if c.capital == cap]
        assert len(owners) == 1 and list(owners[0].currencies) == q["answers"]
    for q in bank["borders_to_capital"]:
        a, b = re.search(r"both (.+) and (.+)\?$", q["question"]).groups()
        owners = [c for c in countries.values() if a in c.borders and b in c.borders]
        assert [c.name for c in owners] == [q["country"]]  # the bridge is unambiguous


def test_tasks_seeded_and_mixed() -> None:
    env = make_env("search_qa", size=200, multi_hop_fraction=0.5)
    tasks = list(env.tasks(seed=1))
    assert tasks == list(env.tasks(seed=1)) and tasks != list(env.tasks(seed=2))
    hops = [t["hops"] for t in tasks]
    assert 60 < hops.count(2) < 140
    only_single = make_env("search_qa", size=50, kinds=["capital", "currency"])
    assert {t["kind"] for t in only_single.tasks()} <= {"capital", "currency"}
    with pytest.raises(ConfigError, match=r"unknown question kind 'capitol'.*'capital'"):
        make_env("search_qa", kinds=["capitol"])


def test_index_built_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_env("search_qa")
    index = SearchQAEnv.index()
    assert SearchQAEnv.index() is index
    builds: list[int] = []
    real = LocalSearchIndex.from_documents.__func__  # type: ignore[attr-defined]

    def counted(cls: type, *args: object, **kwargs: object) -> object:
        builds.append(1)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(LocalSearchIndex, "from_documents", classmethod(counted))
    spawned = [env.spawn() for _ in range(20)]
    assert builds == []  # twenty episodes, no second index
    assert all(e.tools[0].backend is index for e in spawned)


@pytest.mark.anyio
async def test_search_finds_the_country_of_every_question() -> None:
    env = make_env("search_qa", top_k=5, call_format="tool_call", kinds=list(KINDS)).spawn()
    bank = question_bank().by_kind
    await env.reset(bank["capital"][0])
    try:
        misses: list[tuple[str, str]] = []
        total = 0
        for kind in SINGLE_HOP + MULTI_HOP:
            questions = bank[kind]
            queries = [
                q["question"] if kind in SINGLE_HOP else bridge_query(q["question"])
                for q in questions
            ]
            for start in range(0, len(questions), 16):  # 16 concurrent calls per turn
                chunk = questions[start : start + 16]
                result = await env.step(
                    AssistantTurn(search_calls(queries[start : start + 16]), [])
                )
                assert not result.done and len(result.observations) == len(chunk)
                for q, obs in zip(chunk, result.observations, strict=True):
                    found = titles(obs["content"])
                    total += 1
                    limit = 3 if kind in SINGLE_HOP else 5
                    if q["country"] not in found[:limit]:
                        misses.append((kind, q["question"]))
        single_misses = [m for m in misses if m[0] in SINGLE_HOP]
        assert single_misses == [], single_misses[:5]
        assert len(misses) <= 0.02 * total, misses[:10]
    finally:
        await env.close()


@pytest.mark.anyio
async def test_reward_exact_match_and_f1() -> None:
    env = make_env("search_qa").spawn()
    task = next(q for q in question_bank().by_kind["capital_to_region"] if q["answer"] == "Europe")
    try:
        await env.reset(task)
        result = await env.step(AssistantTurn("\\boxed{europe.}", []))
        assert result.done and result.outcome == 1.0 and result.info["f1"] == 1.0
    finally:
        await env.close()
    env = env.spawn()
    try:
        await env.reset(task)
        result = await env.step(AssistantTurn("\\boxed{Western Europe}", []))
        assert result.done and result.outcome == 0.0
        assert result.info["f1"] == pytest.approx(2 / 3)
    finally:
        await env.close()
    currency = next(q for q in question_bank().by_kind["currency"] if len(q["answers"]) > 1)
    verifier = make_env("search_qa").verifier
    for code in currency["answers"]:
        assert verifier.score(f"\\boxed{{{code}}}", currency)[0] == 1.0
    assert verifier.score("\\boxed{XXX}", currency)[0] == 0.0


@pytest.mark.anyio
async def test_search_delay_option() -> None:
    env = make_env("search_qa", search_delay_s=0.3, call_format="tool_call").spawn()
    await env.reset(question_bank().by_kind["capital"][0])
    tool = env.tools[0]
    meeting = Meeting(tool.backend, expected=4)
    tool.backend = meeting
    try:
        # allow-clock: a lower bound on a delay option's own delay (load only lengthens it)
        t0 = time.perf_counter()
        result = await env.step(AssistantTurn(search_calls(["capital France"] * 4), []))
        # allow-clock: the same lower bound; no upper bound (concurrency is the meeting's)
        assert time.perf_counter() - t0 >= 0.3
        # the four delayed calls were all in flight at once: none searched before all came
        assert meeting.met and len(result.observations) == 4
        assert titles(result.observations[0]["content"])[0] == "France"
    finally:
        await env.close()


class Meeting:
    """A search backend that answers only once `expected` searches are waiting on it:
    delayed calls run one after another never meet (the safety timeout fails them)."""

    def __init__(self, backend: object, expected: int) -> None:
        self.backend, self.expected = backend, expected
        self.waiting = 0
        self.all_here = anyio.Event()
        self.met = False

    async def search(self, query: str, k: int) -> list:
        self.waiting += 1
        if self.waiting == self.expected:
            self.met = True
            self.all_here.set()
        with anyio.fail_after(120):  # bounds a hang only: sequential calls never meet
            await self.all_here.wait()
        return await self.backend.search(query, k)  # type: ignore[attr-defined]
