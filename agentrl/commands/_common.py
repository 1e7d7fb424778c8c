"""What the commands share: the ``--set`` option and the one-line exit for a user error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Optional

import typer

from agentrl.errors import user_error

SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="override: section.key=value")]  # noqa: UP045
EpochsOpt = Annotated[int, typer.Option(min=1)]
MaxLengthOpt = Annotated[int, typer.Option(min=16)]
SeedOpt = Annotated[int, typer.Option()]


def optional(kind: Any, help: str, *names: str) -> Any:
    """The annotation of an option that may be left out (default None): a `kind` value,
    spelled `names` (default: from the parameter's name)."""
    return Annotated[Optional[kind], typer.Option(*names, help=help)]  # noqa: UP045


def flag(name: str, help: str) -> Any:
    """The annotation of an on/off option spelled `name` (default off)."""
    return Annotated[bool, typer.Option(name, help=help)]


DeviceOpt = optional(str, "overrides learner.device")

# True when the process is the `agentrl` program itself (agentrl.cli.main), not a command
# called in another program (a test's CliRunner): only then may a command restart the
# process (agentrl.cpu.restart_with_allocator)
PROGRAM = {"entry": False}


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


def key_values(pairs: list[str], option: str, example: str) -> dict[str, Any]:
    """``KEY=VALUE`` options as a dict; a VALUE that parses as JSON is that value, else text."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"{option} expects KEY=VALUE (got {pair!r}), e.g. {example}")
        try:
            out[key.strip()] = json.loads(value)
        except ValueError:
            out[key.strip()] = value
    return out
