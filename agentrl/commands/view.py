"""`agentrl view`: a local web page over a run (or a folder of runs) while it trains."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DEFAULT_PORT = 8765


def view(
    run_dir: Annotated[
        Path,
        typer.Argument(
            help="a run folder of `agentrl train` / `agentrl rollout --out`, or a folder of runs"
        ),
    ],
    port: Annotated[
        int, typer.Option("--port", help="port on 127.0.0.1 (0: any free port)")
    ] = DEFAULT_PORT,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", help="refresh pages as the run grows (on by default while it trains)"
        ),
    ] = False,
) -> None:
    """Serve a local web page for runs, groups, trajectories, token heatmaps and branch trees."""
    from agentrl.errors import AgentRLError

    if not 0 <= port <= 65535:
        typer.secho(f"error: --port must be 0..65535 (got {port})", fg="red", err=True)
        raise typer.Exit(2)
    try:
        from agentrl.view.server import ViewServer

        server = ViewServer(run_dir, port, follow=follow)
    except (AgentRLError, OSError) as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"agentrl view: {server.url}  ({run_dir}; Ctrl-C stops)")
    server.run()


def register(app: typer.Typer) -> None:
    app.command()(view)
