"""The `agentrl` command line.

Each area of the package contributes its commands from a module in
``agentrl/commands/`` exposing ``register(app)``; heavy imports happen inside the
commands, so ``agentrl --help`` stays fast.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="agentrl",
    help="Train tool-using LLM agents with asynchronous reinforcement learning.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


@app.command()
def version() -> None:
    """Print the agentrl version."""
    from agentrl import __version__

    typer.echo(__version__)


_COMMAND_MODULES = ("train", "rollout", "envs", "sandbox", "export", "rm", "sft", "serve", "view")
_COMMAND_MODULES += ("config",)  # `agentrl config docs`: the reference page
_COMMAND_MODULES += ("dpo",)  # preference optimisation (agentrl.preference)
_COMMAND_MODULES += ("grade",)  # score one answer as training would (agentrl grade)
_COMMAND_MODULES += ("check",)  # agentrl check mismatch: the sampler-vs-learner gap

for _name in _COMMAND_MODULES:
    try:
        _mod = importlib.import_module(f"agentrl.commands.{_name}")
    except ModuleNotFoundError as _e:  # an area that is not built yet
        if _e.name != f"agentrl.commands.{_name}":
            raise
        continue
    _mod.register(app)


def main() -> None:
    """The ``agentrl`` program (the console script; ``python -m agentrl.cli``)."""
    from agentrl.commands._common import PROGRAM

    PROGRAM["entry"] = True
    app()


if __name__ == "__main__":
    main()
