"""Serve a :class:`LocalSearchIndex` over HTTP with the shape :class:`HttpSearchBackend` expects.

    with SearchServer(index) as server:          # 127.0.0.1, a free port, a daemon thread
        backend = HttpSearchBackend(server.url)

``POST /search`` with ``{"query": str, "k": int}`` answers ``{"results": [{"title",
"snippet", "id", "score"}, ...]}``; a bad request answers 400 with ``{"error": ...}``.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agentrl.tools.search import LocalSearchIndex


class SearchServer:
    def __init__(self, index: LocalSearchIndex, host: str = "127.0.0.1", port: int = 0) -> None:
        self.index = index
        self.httpd = ThreadingHTTPServer((host, port), _handler(index))
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/search"

    def start(self) -> SearchServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> SearchServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler(index: LocalSearchIndex) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # keep test and server output quiet
            pass

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/search":
                self._send(404, {"error": f"no such endpoint {self.path!r}; use POST /search"})
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
                request = json.loads(self.rfile.read(length) or b"{}")
                query, k = request["query"], int(request.get("k", 3))
                if not isinstance(query, str) or k < 1:
                    raise ValueError("'query' must be a string and 'k' >= 1")
            except (ValueError, KeyError, TypeError) as e:
                self._send(400, {"error": f"bad request: {e}"})
                return
            hits = index.search_sync(query, k)
            self._send(200, {"results": [asdict(h) for h in hits]})

    return Handler
