"""A local server for the Tinker training API (``agentrl serve --tinker CONFIG``; docs/tinker.md).

The official ``tinker`` SDK and ``tinker-cookbook`` run unchanged against it: point
``tinker.ServiceClient(base_url=...)`` at the URL. One base model is loaded once; every
training client is a LoRA adapter with its own AdamW on it (:mod:`.engine`), requests are
futures served in turn by one worker (:mod:`.futures`), the HTTP routes are :mod:`.server`
and the SDK's protobuf bodies :mod:`.wire`. The engine runs in the server's process, in a Ray
actor or on torch.distributed ranks (:mod:`.placement`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.run.tinker.engine import Engine

if TYPE_CHECKING:  # the HTTP side needs fastapi (the [tinker] extra); the engine does not
    from agentrl.run.tinker.server import TinkerServer, TinkerService


def open_server(
    base_model: str,
    state_dir: Path,
    *,
    dtype: str | None = "float32",
    device: str = "cpu",
    host: str = "127.0.0.1",
    port: int = 0,
) -> TinkerServer:
    """Load `base_model` (alias, folder or .gguf) and start serving it; ``.url`` is the base URL.

    Checkpoints (``tinker://`` paths) are folders under `state_dir`; the tokenizer is
    written there too, so clients load it from ``get_info``'s ``tokenizer_id``.
    """
    from agentrl.run.tinker.placement import EngineSettings, load_engine

    settings = EngineSettings(base_model, dtype, device)
    return serve_engine(load_engine(settings, Path(state_dir)), Path(state_dir), host, port)


def serve_engine(
    engine: Any, state_dir: Path, host: str = "127.0.0.1", port: int = 0
) -> TinkerServer:
    """Serve `engine` (an :class:`Engine`, or a proxy of one in another process) over HTTP;
    the tokenizer is written under `state_dir` for the SDK's ``get_tokenizer``."""
    from agentrl.run.tinker.server import TinkerServer, TinkerService

    tokenizer_dir = Path(state_dir) / "tokenizer"
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    engine.tokenizer.save_pretrained(tokenizer_dir)
    server = TinkerServer(TinkerService(engine, str(tokenizer_dir.resolve())), host, port)
    server.start()
    return server


def __getattr__(name: str) -> Any:
    if name in ("TinkerServer", "TinkerService"):
        from agentrl.run.tinker import server

        return getattr(server, name)
    raise AttributeError(name)


__all__ = ["Engine", "TinkerServer", "TinkerService", "open_server", "serve_engine"]
