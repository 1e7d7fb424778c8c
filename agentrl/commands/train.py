"""`agentrl train`, `agentrl eval`, `agentrl plot`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from agentrl.commands._common import PROGRAM, SetOpt, exit_on_user_error

if TYPE_CHECKING:
    from agentrl.view import ViewServer


def _default_run_dir(config: Path) -> Path:
    return Path("runs") / f"{config.stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def train(
    config: Annotated[Path, typer.Argument(help="YAML config, e.g. configs/demo.yaml")],
    set_: SetOpt = None,
    run_dir: Annotated[
        Path | None, typer.Option("--run-dir", help="where metrics, traces and checkpoints go")
    ] = None,
    resume: Annotated[
        Path | None, typer.Option("--resume", help="continue the run in this directory")
    ] = None,
    summary: Annotated[
        bool, typer.Option(help="print a table and write curves.png at the end")
    ] = True,
    view: Annotated[
        bool, typer.Option("--view", help="serve `agentrl view` on the run while it trains")
    ] = False,
    view_port: Annotated[
        int, typer.Option("--view-port", help="the viewer's port on 127.0.0.1 (0: any free)")
    ] = 8765,
) -> None:
    """Train an agent with the given config."""
    import anyio

    from agentrl.cpu import restart_with_allocator
    from agentrl.run.preflight import load_run_config
    from agentrl.runfolder import CONFIG

    with exit_on_user_error():
        if resume is not None:
            cfg_path = config if config.is_file() else resume / CONFIG
            cfg = load_run_config(cfg_path, set_ or [], "train")
            target = resume
        else:  # every config problem at once, before the run folder or a model exists
            cfg = load_run_config(config, set_ or [], "train")
            target = run_dir or Path(cfg.orchestrator.run_dir or _default_run_dir(config))
        if PROGRAM["entry"]:  # tcmalloc is preloaded at start or not at all (agentrl.cpu)
            restart_with_allocator(cfg.orchestrator.cpu_allocator)
        from agentrl.run.orchestrator import train as run_train

        viewer = _start_viewer(target, view_port) if view else None
        try:
            anyio.run(run_train, cfg, target, resume is not None)
        finally:
            if viewer is not None:
                viewer.stop()
    if summary:
        _print_summary(target)


def _start_viewer(run_dir: Path, port: int) -> ViewServer:
    """`agentrl view` on a thread beside the training; it reads the run, never writes it."""
    from agentrl.view import serve_in_thread

    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        viewer = serve_in_thread(run_dir, port, follow=True, pending_run=True)
    except OSError as e:  # the port is taken: say so before any training starts
        typer.secho(f"error: --view: {e}", fg="red", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"agentrl view: {viewer.url}  (live while this run trains)")
    return viewer


def _print_summary(run_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from agentrl.errors import MissingExtra
    from agentrl.run.plotting import learning_summary, plot_run, read_steps
    from agentrl.runfolder import read_metrics

    steps = read_steps(run_dir)
    if not steps:
        return
    table = Table(title=f"training summary: {run_dir}")
    cols = {
        "step": "step",
        "reward_mean": "reward",
        "success_rate": "success",
        "entropy": "entropy",
        "pg/clip_frac": "clip",
        "staleness/mean": "stale",
        "monitor/reward_std": "r std",
        "monitor/repetition": "repeat",
        "monitor/length_drift": "len drift",
        "monitor/mismatch_kl_k3": "mismatch kl",
        "distill/reverse_kl": "teacher kl",
        "tool_calls_per_episode": "tools/ep",
        "rollout_tokens_per_s": "tok/s",
        "train_seconds": "train s",
    }
    # a monitor the run did not log (no distillation, no learner log-probs) gets no column
    optional = ("monitor/", "distill/")
    cols = {
        k: v for k, v in cols.items() if not k.startswith(optional) or any(k in s for s in steps)
    }
    for label in cols.values():
        table.add_column(label, justify="right")
    for s in steps:
        table.add_row(*[_fmt(s.get(c)) for c in cols])
    console = Console()
    console.print(table)
    summary = learning_summary(steps)
    if summary:
        console.print(
            f"reward: first 3 steps {summary['first_k_reward']:.3f} -> last 3 steps "
            f"{summary['last_k_reward']:.3f} (gain {summary['gain']:+.3f})"
        )
        (run_dir / "summary.json").write_text(json.dumps({**summary, "steps": steps}, indent=1))
    alerts = [row for row in read_metrics(run_dir) if row.get("event") == "AlertFired"]
    if alerts:  # monitors.alerts: each metric once, with the steps it fired at
        fired: dict[str, list[str]] = {}
        for a in alerts:
            fired.setdefault(f"{a['metric']} {a['side']} {a['bound']:g}", []).append(str(a["step"]))
        for what, at in fired.items():
            console.print(f"alert: {what} at steps {', '.join(at)}", markup=False, soft_wrap=True)
    try:
        console.print(f"curves: {plot_run(run_dir)}")
    except MissingExtra as e:  # the run is fine; only the picture needs the plots extra
        console.print(f"curves: not drawn ({e})", markup=False, soft_wrap=True)


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 1000 else f"{v:.0f}"
    return "" if v is None else str(v)


def plot(
    run_dir: Annotated[Path, typer.Argument(help="a run directory of `agentrl train`")],
    out: Annotated[Path | None, typer.Option(help="PNG path (default RUN_DIR/curves.png)")] = None,
) -> None:
    """Plot training curves (reward, success, entropy, KL, clip fraction, staleness, ...)."""
    from agentrl.run.plotting import plot_run

    with exit_on_user_error():
        typer.echo(str(plot_run(run_dir, out)))


def eval_(
    config: Annotated[Path, typer.Argument(help="YAML config")],
    checkpoint: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--checkpoint", help="a run dir or checkpoint dir (none: the base model)"),
    ] = None,
    set_: SetOpt = None,
    n_tasks: Annotated[int, typer.Option("-n", help="held-out tasks")] = 32,
    samples: Annotated[int, typer.Option("-k", help="samples per task (pass@k, maj@k)")] = 4,
    out: Annotated[Optional[Path], typer.Option(help="write results JSON here")] = None,  # noqa: UP045
) -> None:
    """Evaluate a checkpoint (or the base model) on held-out tasks: pass@k and maj@k."""
    import anyio

    from agentrl.cpu import set_allocator
    from agentrl.run.evaluation import evaluate, print_eval
    from agentrl.run.preflight import load_run_config

    with exit_on_user_error():
        cfg = load_run_config(config, set_ or [], "eval")
        set_allocator(cfg.orchestrator.cpu_allocator)  # before the sampler's thread starts
        result = anyio.run(evaluate, cfg, checkpoint, n_tasks, samples)
    print_eval(result)
    if out:
        out.write_text(json.dumps(result, indent=1))


def register(app: typer.Typer) -> None:
    app.command()(train)
    app.command("eval")(eval_)
    app.command()(plot)
