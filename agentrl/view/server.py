"""Serving the viewer on 127.0.0.1: in the foreground (`agentrl view`) or on a thread beside
a training run (`agentrl train --view`)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import uvicorn

from agentrl.view.app import create_app

HOST = "127.0.0.1"  # local only: a run's trace can hold prompts and tool outputs


def bind(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1 (`port` 0: a free one); a clear error when taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
    except OSError as e:
        sock.close()
        raise OSError(
            f"port {port} on {HOST} is in use ({e.strerror}): pass --port N or --port 0"
        ) from None
    sock.listen(128)
    return sock


class ViewServer:
    """The viewer's uvicorn server on an already bound socket."""

    def __init__(
        self, root: Path, port: int = 0, follow: bool = False, pending_run: bool = False
    ) -> None:
        self.app = create_app(root, follow=follow, pending_run=pending_run)
        self.sock = bind(port)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{HOST}:{self.port}/"
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off")
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        """Serve until Ctrl-C (the foreground of `agentrl view`)."""
        try:
            self.server.run(sockets=[self.sock])
        finally:
            self.sock.close()

    def start(self) -> ViewServer:
        """Serve on a daemon thread; returns once it accepts connections."""
        self._thread = threading.Thread(target=self.run, name="agentrl-view", daemon=True)
        self._thread.start()
        while not self.server.started and self._thread.is_alive():
            self._thread.join(0.02)
        if not self.server.started:
            raise RuntimeError("the viewer did not start (see the log above)")
        return self

    def stop(self) -> None:
        self.app.state.indexer.stop()
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(5)


def serve_in_thread(
    root: Path, port: int = 0, follow: bool = True, pending_run: bool = False
) -> ViewServer:
    """Start the viewer over `root` on a thread (stop it with :meth:`ViewServer.stop`)."""
    return ViewServer(root, port, follow=follow, pending_run=pending_run).start()
