"""The ``search`` tool: top-k titled snippets from a local tantivy index or an HTTP service.

Backends implement ``async search(query, k) -> list[SearchHit]``:

* :class:`LocalSearchIndex` -- BM25 over ``{"title", "text", "id"}`` documents with tantivy
  (accent folding, English stop words and stemming), in memory or in a folder.
* :class:`HttpSearchBackend` -- a remote service. Request: ``POST <url>`` with JSON
  ``{"query": "<text>", "k": <int>}``. Response (200): ``{"results": [{"title": str,
  "snippet": str, "id": str (optional), "score": float (optional)}, ...]}`` (``"text"`` is
  accepted instead of ``"snippet"``). Connection errors, timeouts, 429 and 5xx are retried
  with exponential backoff; other statuses and malformed bodies raise
  :class:`~agentrl.errors.ToolError` at once (an infrastructure failure, not the agent's).
  :mod:`agentrl.tools.search_server` serves a local index with this shape.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import anyio
from pydantic import BaseModel, ConfigDict, Field

from agentrl.errors import DatasetError, ToolError
from agentrl.extras import require
from agentrl.tools.base import Tool, ToolContext, ToolOutput

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
ANALYZER = "agentrl_en"
_QUERY_SYNTAX = re.compile(r"[^\w\s]+")


@dataclass
class SearchHit:
    title: str
    snippet: str
    id: str = ""
    score: float = 0.0


class SearchBackend(Protocol):
    async def search(self, query: str, k: int) -> list[SearchHit]: ...


# --- local index -----------------------------------------------------------------------


class LocalSearchIndex:
    """A tantivy full-text index over documents with ``title``, ``text`` and ``id``.

    ``path``: a folder to keep the index in (created; must be empty or absent); None keeps
    it in memory. ``snippet_chars``: length of the snippet around the best-matching terms.
    """

    def __init__(
        self,
        documents: Iterable[Mapping[str, Any]],
        path: str | os.PathLike[str] | None = None,
        snippet_chars: int = 300,
        title_boost: float = 1.0,
    ) -> None:
        tantivy = require("tantivy", "demo", "the search index")

        self.snippet_chars = snippet_chars
        self.title_boost = title_boost
        builder = tantivy.SchemaBuilder()
        builder.add_text_field("title", stored=True, tokenizer_name=ANALYZER)
        builder.add_text_field("text", stored=True, tokenizer_name=ANALYZER)
        builder.add_text_field("id", stored=True, tokenizer_name="raw")
        self._schema = builder.build()
        if path is not None:
            Path(path).mkdir(parents=True, exist_ok=True)
            self._index = tantivy.Index(self._schema, path=str(path))
        else:
            self._index = tantivy.Index(self._schema)
        self._index.register_tokenizer(ANALYZER, _analyzer())
        writer = self._index.writer(heap_size=50_000_000, num_threads=1)
        self._size = 0
        for i, doc in enumerate(documents):
            title, text = _field(doc, "title", i), _field(doc, "text", i)
            doc_id = str(doc.get("id", i))
            writer.add_document(tantivy.Document(title=title, text=text, id=doc_id))
            self._size += 1
        writer.commit()
        writer.wait_merging_threads()
        self._index.reload()

    @classmethod
    def from_documents(
        cls, documents: Iterable[Mapping[str, Any]], **kwargs: Any
    ) -> LocalSearchIndex:
        return cls(documents, **kwargs)

    def __len__(self) -> int:
        return self._size

    def search_sync(self, query: str, k: int = 3) -> list[SearchHit]:
        """Blocking search (microseconds to milliseconds); :meth:`search` runs it in a thread."""
        tantivy = require("tantivy", "demo", "the search index")

        if k < 1:
            raise ValueError(f"k must be >= 1 (got {k})")
        if not query.strip():
            return []
        words = _QUERY_SYNTAX.sub(" ", query)  # plain words: no field/range/phrase syntax
        if not words.strip():
            return []
        parsed, _errors = self._index.parse_query_lenient(
            words, ["title", "text"], field_boosts={"title": self.title_boost}
        )
        searcher = self._index.searcher()
        hits = searcher.search(parsed, k).hits
        snippets = tantivy.SnippetGenerator.create(searcher, parsed, self._schema, "text")
        snippets.set_max_num_chars(self.snippet_chars)
        out = []
        for score, address in hits:
            doc = searcher.doc(address)
            text = doc["text"][0] if doc["text"] else ""
            snippet = snippets.snippet_from_doc(doc).fragment() or text[: self.snippet_chars]
            out.append(SearchHit(doc["title"][0], snippet.strip(), doc["id"][0], float(score)))
        return out

    async def search(self, query: str, k: int = 3) -> list[SearchHit]:
        return await anyio.to_thread.run_sync(self.search_sync, query, k)


def _analyzer() -> Any:
    """Words, lowercased, accents folded, English stop words dropped ("the" in a title
    must not outrank a rare name), stemmed."""
    tantivy = require("tantivy", "demo", "the search index")

    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(40))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.ascii_fold())
        .filter(tantivy.Filter.stopword("english"))
        .filter(tantivy.Filter.stemmer("english"))
        .build()
    )


def _field(doc: Mapping[str, Any], name: str, i: int) -> str:
    value = doc.get(name)
    if not isinstance(value, str):
        got = "missing" if value is None else f"a {type(value).__name__}"
        raise DatasetError(f"search document {i}: field {name!r} must be a string (got {got})")
    return value


# --- HTTP backend ----------------------------------------------------------------------


class HttpSearchBackend:
    """A remote search service (request/response shape in the module doc).

    Attempt ``n`` (0-based) that fails transiently waits ``min(backoff_s * 2**n,
    max_backoff_s)`` (or the server's ``Retry-After`` when shorter) before the next one;
    after ``retries`` retries a :class:`ToolError` is raised.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if retries < 0:
            raise ValueError(f"retries must be >= 0 (got {retries})")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds (got {timeout})")
        self.url = url
        self.timeout = timeout
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.headers = dict(headers or {})
        self._client: Any = None
        self._loop: Any = None
        self.attempts = 0  # total HTTP attempts made (for tests and metrics)

    def _get_client(self) -> Any:
        import httpx

        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:  # a client belongs to one loop
            self._client = httpx.AsyncClient(timeout=self.timeout, headers=self.headers)
            self._loop = loop
        return self._client

    async def search(self, query: str, k: int) -> list[SearchHit]:
        import httpx

        client = self._get_client()
        last = ""
        for attempt in range(self.retries + 1):
            self.attempts += 1
            wait = min(self.backoff_s * 2**attempt, self.max_backoff_s)
            try:
                resp = await client.post(self.url, json={"query": query, "k": k})
            except httpx.TransportError as e:  # connection refused/reset, timeouts
                last = f"{type(e).__name__}: {e}"
            else:
                if resp.status_code == 200:
                    return _parse_hits(self.url, resp)
                body = resp.text[:200]
                if resp.status_code not in RETRY_STATUSES:
                    raise ToolError(
                        f"search service {self.url} answered HTTP {resp.status_code}: {body}"
                    )
                last = f"HTTP {resp.status_code}: {body}"
                wait = min(wait, _retry_after(resp) or wait)
            if attempt < self.retries:
                await anyio.sleep(wait)
        raise ToolError(
            f"search service {self.url} failed after {self.retries + 1} attempts (last: {last})"
        )

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()


def _retry_after(resp: Any) -> float | None:
    try:
        return max(float(resp.headers.get("retry-after", "")), 0.0)
    except ValueError:
        return None


def _parse_hits(url: str, resp: Any) -> list[SearchHit]:
    try:
        payload = resp.json()
        hits = []
        for r in payload["results"]:
            snippet = r.get("snippet", r.get("text"))
            if not isinstance(r.get("title"), str) or not isinstance(snippet, str):
                raise TypeError("each result needs string 'title' and 'snippet'")
            hits.append(
                SearchHit(r["title"], snippet, str(r.get("id", "")), float(r.get("score", 0.0)))
            )
        return hits
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ToolError(
            f"search service {url} returned a malformed body ({e}); expected "
            '{"results": [{"title": ..., "snippet": ...}, ...]}'
        ) from e


# --- the tool --------------------------------------------------------------------------


class SearchArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, description="What to search for, e.g. 'capital of Peru'.")


class SearchTool(Tool):
    """Search a document collection; returns the top ``k`` titled snippets.

    ``delay_s`` adds artificial latency to every call (to benchmark a slow remote service
    with a local index).
    """

    name: ClassVar[str] = "search"
    description: ClassVar[str] = (
        "Search the document collection. Returns the best matching documents, each with "
        "its title and a snippet of its text."
    )
    Args: ClassVar[type[BaseModel]] = SearchArgs

    def __init__(
        self, backend: SearchBackend, k: int = 3, *, timeout: float = 10.0, delay_s: float = 0.0
    ) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1 (got {k})")
        self.backend = backend
        self.k = k
        self.timeout = timeout
        self.delay_s = delay_s

    async def call(self, args: BaseModel, ctx: ToolContext) -> ToolOutput:
        query: str = args.query  # type: ignore[attr-defined]
        if self.delay_s > 0:
            await anyio.sleep(self.delay_s)
        hits = await self.backend.search(query, self.k)
        return ToolOutput(format_hits(query, hits), data=[asdict(h) for h in hits])


def format_hits(query: str, hits: list[SearchHit]) -> str:
    if not hits:
        return f"no results for {query!r}"
    return "\n\n".join(f"[{i}] {h.title}\n{h.snippet}" for i, h in enumerate(hits, 1))
