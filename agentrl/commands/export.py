"""`agentrl export RUN_DIR [--step N] OUT`: a checkpoint as a Hugging Face model folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from agentrl.commands._common import exit_on_user_error


def export(
    run_dir: Annotated[Path, typer.Argument(help="a run directory of `agentrl train`")],
    out: Annotated[
        Path, typer.Argument(help="the folder to write (AutoModelForCausalLM loads it)")
    ],
    step: Annotated[int | None, typer.Option(help="a checkpoint's step (default: latest)")] = None,
    dtype: Annotated[
        Optional[str], typer.Option(help="float32, bfloat16 or float16 (default: as trained)")  # noqa: UP045
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="replace a non-empty OUT")] = False,
) -> None:
    """Export a checkpoint: weights, config, tokenizer, chat template, generation config.

    RUN_DIR may also be a checkpoint folder of `agentrl serve --tinker`
    (STATE_DIR/MODEL_ID/weights/NAME): its LoRA is merged into the base model.
    """
    from agentrl.run.export import export_checkpoint

    with exit_on_user_error():
        if (run_dir / "lora.json").is_file():  # a checkpoint of agentrl serve --tinker
            from agentrl.run.tinker.interop import export_tinker_checkpoint

            path = export_tinker_checkpoint(run_dir, out, dtype=dtype, overwrite=overwrite)
        else:
            path = export_checkpoint(run_dir, out, step=step, dtype=dtype, overwrite=overwrite)
    typer.echo(str(path))


def register(app: typer.Typer) -> None:
    app.command()(export)
