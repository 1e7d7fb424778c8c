"""What the commands share: the ``--set`` option and the one-line exit for a user error."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Optional

import typer

from agentrl.errors import user_error

SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="override: section.key=value")]  # noqa: UP045


@contextmanager
def exit_on_user_error() -> Iterator[None]:
    """An :class:`~agentrl.errors.AgentRLError` (also inside an exception group) becomes
    ``error: ...`` on stderr and exit status 2; anything else (a bug) propagates."""
    try:
        yield
    except Exception as e:
        error = user_error(e)
        if error is None:
            raise
        typer.secho(f"error: {error}", fg="red", err=True)
        raise typer.Exit(2) from None
