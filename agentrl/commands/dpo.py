"""`agentrl dpo [DATA]`: preference optimisation (DPO, IPO, KTO, ORPO, SimPO, ...), from a
file or from the run's own rollouts (``--online``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from agentrl.commands._common import SetOpt, exit_on_user_error


def dpo(
    data: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Argument(help="JSONL of pairs or unpaired rows (default: the config's data.path)"),
    ] = None,
    run_dir: Annotated[
        Path, typer.Option(help="where checkpoints, metrics and the model go")
    ] = Path("runs/dpo"),
    config: Annotated[
        Optional[Path], typer.Option(help="a YAML config (its preference section, model, env)")  # noqa: UP045
    ] = None,
    set_: SetOpt = None,
    model: Annotated[Optional[str], typer.Option(help="the policy (sets model.name)")] = None,  # noqa: UP045
    loss: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="dpo, cdpo, robust, ipo, hinge, kto, orpo, simpo, tdpo (preference.loss)"
        ),
    ] = None,
    beta: Annotated[Optional[float], typer.Option(help="preference.beta")] = None,  # noqa: UP045
    epochs: Annotated[Optional[int], typer.Option(min=1)] = None,  # noqa: UP045
    lr: Annotated[Optional[float], typer.Option(help="learner.lr")] = None,  # noqa: UP045
    batch_size: Annotated[Optional[int], typer.Option(min=1)] = None,  # noqa: UP045
    online: Annotated[
        bool, typer.Option(help="pairs from the config's environment's rollouts, in rounds")
    ] = False,
    rounds: Annotated[Optional[int], typer.Option(min=1, help="online rounds")] = None,  # noqa: UP045
    out: Annotated[
        Optional[Path], typer.Option(help="the model folder (default RUN_DIR/model)")  # noqa: UP045
    ] = None,
    resume: Annotated[
        bool, typer.Option(help="continue RUN_DIR from its latest checkpoint")
    ] = False,
) -> None:
    """Train on preferences; the result is a model folder and `agentrl export`-able checkpoints."""
    from agentrl.run.preflight import load_run_config

    if online and data is not None:
        raise typer.BadParameter("--online takes its pairs from rollouts: drop DATA")
    overrides = list(set_ or [])
    for key, value in (
        ("model.name", model),
        ("preference.loss", loss),
        ("preference.beta", beta),
        ("preference.epochs", epochs),
        ("learner.lr", lr),
        ("preference.batch_size", batch_size),
        ("preference.rounds", rounds),
    ):
        if value is not None:
            overrides.append(f"{key}={value}")
    if resume and (overrides or config is not None):
        raise typer.BadParameter(
            "--resume continues with RUN_DIR/config.yaml: drop --config, --set and the "
            "training options (or start a new --run-dir)"
        )
    with exit_on_user_error():
        from agentrl.preference.run import train_preference
        from agentrl.run.settings import preference_settings, preference_settings_of_run

        if resume and not online:
            settings = preference_settings_of_run(run_dir)  # the run's own config.yaml
        else:
            cfg = load_run_config(
                config, overrides, "online_preference" if online else "preference"
            )
            if online:
                import anyio

                from agentrl.run.online_preference import online_preference

                done = anyio.run(lambda: online_preference(cfg, run_dir, out=out, log=typer.echo))
                typer.echo(
                    f"{len(done.rounds)} rounds, {done.pairs} pairs ({done.ties} tied groups "
                    f"skipped); mean reward {done.rounds[0]['reward_mean']:.3f} -> "
                    f"{done.rounds[-1]['reward_mean']:.3f}\nmodel: {done.model}"
                )
                return
            settings = preference_settings(cfg)
        report = train_preference(
            data, run_dir, settings=settings, resume=resume, out=out, log=typer.echo
        )
    held = ""
    if report.eval_examples and report.eval_before and report.eval_after:
        held = (
            f"; held-out preference accuracy {report.eval_before['accuracy']:.3f} -> "
            f"{report.eval_after['accuracy']:.3f}"
        )
    typer.echo(
        f"{report.loss}: {report.steps} steps on {report.examples} examples "
        f"({report.examples_per_s:.2f}/s){held}\nmodel: {report.model} (run: {report.run_dir}; "
        f"agentrl export {report.run_dir} OUT also works)"
    )


def register(app: typer.Typer) -> None:
    app.command()(dpo)
