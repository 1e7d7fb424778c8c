"""`agentrl serve --tinker CONFIG`: the config's model behind the Tinker training API."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def serve_tinker(cfg: Any, host: str, port: int, state_dir: Path | None) -> None:
    """Serve ``model.name`` to the official ``tinker`` SDK until Ctrl-C, placed like a
    learner (``learner.device``, ``orchestrator.backend: ray``, ``learner.world_size``);
    checkpoints (``tinker://`` paths) are folders under `state_dir`."""
    from rich.console import Console

    from agentrl.run.tinker.placement import open_server_from_config

    console = Console()
    folder = state_dir or Path("runs") / f"tinker-{time.strftime('%Y%m%d-%H%M%S')}"
    server = open_server_from_config(cfg, folder, host=host, port=port)
    where = server.service.engine.placement
    console.print(
        f"Tinker API for [bold]{cfg.model.name}[/bold] ({where}) at [bold]{server.url}[/bold]; "
        f"checkpoints in {folder}\n"
        f'  tinker.ServiceClient(base_url="{server.url}", api_key="tml-local")  '
        "(any tml- key; Ctrl-C stops)"
    )
    try:
        while True:
            time.sleep(3600)
    finally:
        server.close()
