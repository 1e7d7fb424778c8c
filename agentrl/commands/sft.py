"""`agentrl sft DATA`: supervised warm-start on chat transcripts (RL's token layout)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from agentrl.commands._common import (
    DeviceOpt,
    EpochsOpt,
    MaxLengthOpt,
    SeedOpt,
    SetOpt,
    exit_on_user_error,
    optional,
)


def sft(
    data: Annotated[Path, typer.Argument(help="JSONL of {messages, tools?} transcripts")],
    out: Annotated[Path, typer.Option(help="the model folder to write")],
    model: optional(str, "base model (default: the config's model.name)") = None,
    config: optional(
        Path, "the RL config: its model, template, tools and learner.* settings"
    ) = None,
    set_: SetOpt = None,
    epochs: EpochsOpt = 1,
    lr: optional(float, "overrides learner.lr (default: the config's, else 1e-5)") = None,
    batch_size: Annotated[int, typer.Option(min=1)] = 8,
    max_length: MaxLengthOpt = 2048,
    eval_fraction: Annotated[float, typer.Option(help="held-out share for the loss")] = 0.0,
    seed: SeedOpt = 0,
    device: DeviceOpt = None,
) -> None:
    """Fine-tune on transcripts with assistant-only loss; RL starts from --out."""
    from agentrl.run.preflight import load_run_config
    from agentrl.run.settings import sft_settings
    from agentrl.training.sft import train_sft

    with exit_on_user_error():
        cfg = load_run_config(config, set_ or [], "sft")
        settings = sft_settings(
            cfg,
            model_name=model,
            epochs=epochs,
            lr=lr,
            batch_size=batch_size,
            max_length=max_length,
            eval_fraction=eval_fraction,
            seed=seed,
            device=device,
        )
        report = train_sft(data, out, settings, log=typer.echo)
    held = (
        f"; held-out loss {report.eval_loss_before:.3f} -> {report.eval_loss:.3f}"
        if report.eval_examples
        else ""
    )
    typer.echo(
        f"trained on {report.examples} transcripts ({report.trained_tokens} assistant tokens "
        f"per epoch) in {report.seconds:.0f}s{held}\nmodel: {report.out} "
        f"(start RL from it with --set model.name={report.out})"
    )


def register(app: typer.Typer) -> None:
    app.command()(sft)
