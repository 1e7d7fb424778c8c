"""`agentrl rm train`: a Bradley–Terry reward model from preference pairs."""

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


def register(app: typer.Typer) -> None:
    rm_app = typer.Typer(help="Reward models: train one on preference pairs.", no_args_is_help=True)

    @rm_app.command("train")
    def train(
        pairs: Annotated[Path, typer.Argument(help="JSONL of {prompt, chosen, rejected}")],
        out: Annotated[Path, typer.Option(help="the reward model folder to write")],
        model: optional(
            str, "base model: alias, folder, .gguf or hub id (default: model.name)"
        ) = None,
        config: optional(Path, "a YAML config: its model.name and learner.* settings") = None,
        set_: SetOpt = None,
        epochs: EpochsOpt = 1,
        lr: optional(float, "overrides learner.lr (default: the config's, else 5e-5)") = None,
        batch_size: Annotated[int, typer.Option(min=1, help="pairs per step")] = 8,
        eval_fraction: Annotated[float, typer.Option(help="held-out share of the pairs")] = 0.1,
        max_length: MaxLengthOpt = 1024,
        seed: SeedOpt = 0,
        device: DeviceOpt = None,
    ) -> None:
        """Train a reward model (pairwise loss) and report held-out pairwise accuracy."""
        from agentrl.config import load_config
        from agentrl.rewards.bradley_terry import train_reward_model
        from agentrl.run.settings import reward_model_training_settings

        with exit_on_user_error():
            settings = reward_model_training_settings(
                load_config(config, set_ or []),
                model=model,
                epochs=epochs,
                lr=lr,
                batch_size=batch_size,
                eval_fraction=eval_fraction,
                max_length=max_length,
                seed=seed,
                device=device,
            )
            report = train_reward_model(pairs, out, settings, log=typer.echo)
        typer.echo(
            f"held-out pairwise accuracy: {report.accuracy_before:.3f} before -> "
            f"{report.accuracy:.3f} after ({report.eval_pairs} pairs; trained on "
            f"{report.train_pairs} in {report.seconds:.0f}s)\nreward model: {report.out} "
            f"(use it with --set reward.model={report.out})"
        )

    app.add_typer(rm_app, name="rm")
