"""`agentrl envs`: list the environments (built-ins and installed plug-ins)."""

from __future__ import annotations

import json

import typer


def register(app: typer.Typer) -> None:
    envs_app = typer.Typer(
        help="Environments: built-ins and installed plug-ins.", no_args_is_help=True
    )

    @envs_app.command("list")
    def list_command(
        as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
    ) -> None:
        """List environments with their source, description and tools."""
        from agentrl.envs import list_envs

        rows = list_envs()
        if as_json:
            typer.echo(json.dumps([r.to_dict() for r in rows], indent=2))
            return
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        table = Table(title="agentrl environments")
        for column in ("name", "source", "tools", "extra", "description"):
            table.add_column(column)
        for r in rows:
            desc = r.description if r.error is None else f"[red]error: {r.error}[/red]"
            extra = ""
            if r.extra is not None:
                extra = (
                    f"{r.extra} (installed)"
                    if r.installed
                    else f"[yellow]{r.extra}: pip install {escape(repr(f'agentrl[{r.extra}]'))}[/yellow]"
                )
            table.add_row(r.name, r.source, ", ".join(r.tools or []), extra, desc)
        Console().print(table)

    app.add_typer(envs_app, name="envs")
