"""The search tool: a real tantivy index over country records, and the HTTP backend
against real local HTTP servers (the stand-in for a remote search service)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentrl.errors import DatasetError, ToolError
from agentrl.tools import (
    HttpSearchBackend,
    LocalSearchIndex,
    SearchServer,
    SearchTool,
    ToolContext,
    prepare_calls,
    run_tool_calls,
)


def country_documents() -> list[dict[str, str]]:
    import countryinfo

    docs = []
    for c in countryinfo.all_countries():
        try:
            name, capital = c.name(), c.capital()
        except Exception:  # a few records lack fields
            continue
        if isinstance(capital, list):  # a few records hold a list
            capital = capital[0] if capital else ""
        if not name or not capital:
            continue
        currencies = ", ".join(c.currencies() or [])
        languages = ", ".join(c.languages() or [])
        text = (
            f"{name} is a country in {c.region()}. Its capital is {capital}. "
            f"Population: {c.population()}. Currencies: {currencies}. Languages: {languages}."
        )
        docs.append(
            {"title": name, "text": text, "id": c.iso(2) if c.iso() else name, "capital": capital}
        )
    return docs


@pytest.fixture(scope="module")
def docs():
    return country_documents()


@pytest.fixture(scope="module")
def index(docs):
    return LocalSearchIndex(docs)


def test_every_country_is_found_by_name_and_by_capital(index, docs):
    assert len(index) == len(docs) > 200
    misses, top1, asked = [], 0, 0
    for d in docs:
        for question in (
            f"What is the capital of {d['title']}?",
            f"Which country has the capital {d['capital']}?",
            f"What currency is used in {d['title']}?",
        ):
            titles = [h.title for h in index.search_sync(question, k=3)]
            asked += 1
            top1 += titles[:1] == [d["title"]]
            if d["title"] not in titles:
                misses.append(question)
    assert misses == []
    assert top1 / asked > 0.97


def test_top_hit_and_snippet(index):
    (hit,) = index.search_sync("What currency does Peru use?", k=1)
    assert hit.title == "Peru" and hit.id == "PE"
    assert "Lima" in hit.snippet and "PEN" in hit.snippet
    assert index.search_sync("   ", k=3) == []
    assert index.search_sync("zzzqqq", k=3) == []


def test_query_syntax_is_not_an_error(index):
    for query in ['capital: "Lima', "AND OR NOT (", "title:Peru)", "*?~^"]:
        index.search_sync(query, k=3)  # lenient parsing: never raises


def test_documents_are_validated():
    with pytest.raises(DatasetError, match="search document 1: field 'text' must be a string"):
        LocalSearchIndex([{"title": "a", "text": "b"}, {"title": "c"}])


def test_index_in_a_folder(tmp_path):
    idx = LocalSearchIndex(
        [{"title": "Peru", "text": "Capital Lima", "id": "pe"}], path=tmp_path / "idx"
    )
    assert idx.search_sync("lima", 1)[0].id == "pe"
    assert any((tmp_path / "idx").iterdir())


@pytest.mark.anyio
async def test_search_tool_output_and_delay(index):
    tool = SearchTool(index, k=2, delay_s=0.2)
    text = '<tool_call>{"name": "search", "arguments": {"query": "capital of Japan"}}</tool_call>'
    async with ToolContext() as ctx:
        (result,) = await run_tool_calls(prepare_calls(text, [tool]), ctx)
    assert result.record.error is None and result.record.latency_s >= 0.2
    first = result.message["content"].split("\n\n")[0]
    assert first.startswith("[1] Japan\n") and "Tokyo" in first
    empty = prepare_calls(
        '<tool_call>{"name": "search", "arguments": {"query": ""}}</tool_call>', [tool]
    )
    assert empty.errors == [
        "error: argument 'query': string should have at least 1 character (got '')"
    ]


# --- HTTP backend ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_http_backend_against_the_local_search_server(index):
    with SearchServer(index) as server:
        backend = HttpSearchBackend(server.url, timeout=5)
        try:
            hits = await backend.search("capital of Kenya", 3)
        finally:
            await backend.aclose()
    assert [h.title for h in hits] == [h.title for h in index.search_sync("capital of Kenya", 3)]
    assert hits[0].title == "Kenya" and "Nairobi" in hits[0].snippet


@contextmanager
def scripted_server(
    answer: Callable[[int, dict], tuple[int, object, float]],
) -> Iterator[tuple[str, list]]:
    """A real HTTP server on 127.0.0.1; `answer(n, request)` -> (status, body, delay_s)."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(request)
            status, body, delay = answer(len(seen), request)
            time.sleep(delay)  # allow-sleep: a slow server, what the client must handle
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:  # the client gave up (timeout test)
                pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/search", seen
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


OK_BODY = {"results": [{"title": "Peru", "snippet": "Capital: Lima", "id": "pe", "score": 3.5}]}


@pytest.mark.anyio
async def test_transient_failures_are_retried_with_backoff():
    with scripted_server(lambda n, r: (503, "busy", 0) if n <= 2 else (200, OK_BODY, 0)) as (
        url,
        seen,
    ):
        backend = HttpSearchBackend(url, retries=3, backoff_s=0.1)
        # allow-clock: the backoff is itself a delay; it must have been waited, not skipped
        start = time.perf_counter()
        hits = await backend.search("peru", 2)
        elapsed = time.perf_counter() - start  # allow-clock: the same
        await backend.aclose()
    assert [(h.title, h.snippet, h.id, h.score) for h in hits] == [
        ("Peru", "Capital: Lima", "pe", 3.5)
    ]
    assert seen == [{"query": "peru", "k": 2}] * 3 and backend.attempts == 3
    assert elapsed >= 0.3  # waited 0.1 + 0.2 (a lower bound: load only lengthens it)


@pytest.mark.anyio
async def test_persistent_failure_gives_up_after_the_retries():
    with scripted_server(lambda n, r: (500, "boom", 0)) as (url, seen):
        backend = HttpSearchBackend(url, retries=2, backoff_s=0.01)
        with pytest.raises(ToolError, match=r"failed after 3 attempts \(last: HTTP 500: boom\)"):
            await backend.search("peru", 2)
        await backend.aclose()
    assert len(seen) == 3


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("status", "body", "match"),
    [
        (400, "bad query", "answered HTTP 400: bad query"),
        (200, {"items": []}, "malformed body"),
        (200, "not json", "malformed body"),
        (200, {"results": [{"title": "x"}]}, "malformed body"),
    ],
)
async def test_bad_answers_are_not_retried(status, body, match):
    with scripted_server(lambda n, r: (status, body, 0)) as (url, seen):
        backend = HttpSearchBackend(url, retries=3, backoff_s=0.01)
        with pytest.raises(ToolError, match=match):
            await backend.search("peru", 2)
        await backend.aclose()
    assert len(seen) == 1


@pytest.mark.anyio
async def test_timeouts_and_refused_connections_are_retried():
    with scripted_server(lambda n, r: (200, OK_BODY, 0.5 if n == 1 else 0)) as (url, seen):
        backend = HttpSearchBackend(url, timeout=0.2, retries=1, backoff_s=0.01)
        hits = await backend.search("peru", 1)  # first attempt times out, second succeeds
        await backend.aclose()
    assert hits[0].title == "Peru" and len(seen) == 2

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = HttpSearchBackend(f"http://127.0.0.1:{port}/search", retries=2, backoff_s=0.01)
    with pytest.raises(ToolError, match="ConnectError"):
        await backend.search("peru", 1)
    assert backend.attempts == 3
    await backend.aclose()


@pytest.mark.anyio
async def test_service_down_is_an_infra_error_for_the_episode():
    with scripted_server(lambda n, r: (503, "down", 0)) as (url, _):
        backend = HttpSearchBackend(url, retries=1, backoff_s=0.01)
        tool = SearchTool(backend, k=3)
        text = '<tool_call>{"name": "search", "arguments": {"query": "peru"}}</tool_call>'
        async with ToolContext() as ctx:
            (result,) = await run_tool_calls(prepare_calls(text, [tool]), ctx)
        await backend.aclose()
    assert result.record.infra_error
    assert result.message["content"].startswith(
        "error: tool 'search' is unavailable: search service"
    )
