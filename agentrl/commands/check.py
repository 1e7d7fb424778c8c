"""`agentrl check`: measurements that say whether a setup trains what it claims to.

agentrl check mismatch CONFIG [-n 4] [--max-kl 1e-3] [--json OUT]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from agentrl.commands._common import SetOpt, exit_on_user_error, optional

check_app = typer.Typer(help="Check a setup: the sampler-vs-learner log-prob gap.")


@check_app.command("mismatch")
def mismatch(
    config: Annotated[Path, typer.Argument(help="YAML config (its sampler and learner)")],
    set_: SetOpt = None,
    tasks: Annotated[int, typer.Option("-n", "--tasks", help="task groups to sample", min=1)] = 4,
    max_kl: optional(float, "exit 1 when the k3 KL estimate is above this", "--max-kl") = None,
    max_abs: optional(float, "exit 1 when the mean absolute gap is above this", "--max-abs") = None,
    out: optional(Path, "also write the report here", "--json") = None,
) -> None:
    """Sample a few episodes with the configured sampler and report how far its log-probs
    are from the learner's on the same tokens (mean/max |gap|, KL k3, Pearson)."""
    import anyio

    from agentrl.run.mismatch import measure_mismatch
    from agentrl.run.preflight import load_run_config

    with exit_on_user_error():
        cfg = load_run_config(config, set_ or [], "rollout")
        report = anyio.run(measure_mismatch, cfg, tasks)
    if out is not None:
        out.write_text(json.dumps(report, indent=1))
    if not report.get("tokens"):
        typer.secho("no sampled tokens to compare", fg="red", err=True)
        raise typer.Exit(1)
    typer.echo(
        f"sampler {report['backend']} vs learner on {report['tokens']:.0f} tokens of "
        f"{report['episodes']:.0f} episodes ({report['model']}):"
    )
    for key in ("mean_abs", "max_abs", "kl_k3", "pearson"):
        if key in report:
            typer.echo(f"  {key:9s} {report[key]:.3g}")
    w = report["worst_token"]
    typer.echo(
        f"  worst: token {w['token_id']} at {w['position']} of {w['trajectory']}: sampler "
        f"{w['sampler_logprob']:.4f}, learner {w['learner_logprob']:.4f}"
    )
    failed = [
        f"{name} {report[key]:.3g} > {bound:g}"
        for name, key, bound in (("kl_k3", "kl_k3", max_kl), ("mean_abs", "mean_abs", max_abs))
        if bound is not None and report[key] > bound
    ]
    if failed:
        typer.secho("mismatch above the bound: " + "; ".join(failed), fg="red", err=True)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(check_app, name="check")
