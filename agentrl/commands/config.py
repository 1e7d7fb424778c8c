"""`agentrl config docs`: the configuration reference, generated from the schema."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="The run configuration's schema.", no_args_is_help=True)
    app.add_typer(group, name="config")

    @group.command("docs")
    def docs(
        out: Annotated[Path, typer.Option(help="where the Markdown reference goes")] = Path(
            "docs/config.md"
        ),
        check: Annotated[
            bool, typer.Option("--check", help="exit 1 when OUT differs instead of writing it")
        ] = False,
    ) -> None:
        """Write the configuration reference (every key: type, default, meaning, example)."""
        from agentrl.config_reference import REGENERATE, render

        text = render()
        current = out.read_text() if out.is_file() else None
        if check:
            if current != text:
                typer.secho(f"{out} is stale: run `{REGENERATE}`", fg="red", err=True)
                raise typer.Exit(1)
            typer.echo(f"{out} is up to date")
            return
        if current != text:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
        typer.echo(f"{out} {'rewritten' if current != text else 'up to date'}")
