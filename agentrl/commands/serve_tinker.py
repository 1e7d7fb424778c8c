"""`agentrl serve --tinker CONFIG`: the config's model behind the Tinker training API."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def serve_tinker(cfg: Any, host: str, port: int, state_dir: Path | None) -> None:
    """Serve ``model.name`` (on ``learner.device``) to the official ``tinker`` SDK until
    Ctrl-C; checkpoints (``tinker://`` paths) are folders under `state_dir`."""
    from rich.console import Console

    from agentrl.devices import resolve_device
    from agentrl.run.tinker import open_server

    console = Console()
    folder = state_dir or Path("runs") / f"tinker-{time.strftime('%Y%m%d-%H%M%S')}"
    device = str(resolve_device(cfg.learner.device, "learner.device"))
    dtype = None if cfg.model.dtype == "auto" else cfg.model.dtype
    server = open_server(cfg.model.name, folder, dtype=dtype, device=device, host=host, port=port)
    console.print(
        f"Tinker API for [bold]{cfg.model.name}[/bold] ({device}) at [bold]{server.url}[/bold]; "
        f"checkpoints in {folder}\n"
        f'  tinker.ServiceClient(base_url="{server.url}", api_key="tml-local")  '
        "(any tml- key; Ctrl-C stops)"
    )
    try:
        while True:
            time.sleep(3600)
    finally:
        server.close()
