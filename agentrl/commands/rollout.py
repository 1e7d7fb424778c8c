"""`agentrl rollout` (episodes without training) and `agentrl inspect` (one trajectory)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from agentrl.commands._common import SetOpt, exit_on_user_error

if TYPE_CHECKING:
    from rich.console import Console

    from agentrl.types import Trajectory, TrajectoryGroup


def rollout(
    config: Annotated[Path, typer.Argument(help="YAML config, e.g. configs/demo.yaml")],
    set_: SetOpt = None,
    out: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--out", help="output folder (default runs/rollout-<time>)"),
    ] = None,
    tasks: Annotated[
        int, typer.Option("-n", "--tasks", help="number of tasks (groups)", min=1)
    ] = 4,
    split: Annotated[str, typer.Option(help="task split of the environment")] = "train",
) -> None:
    """Run episodes without training; write DIR/trajectories.jsonl and print a summary."""
    import anyio
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from agentrl.rollout.sinks import JsonlSink
    from agentrl.rollout.summary import summarize
    from agentrl.run.preflight import load_run_config
    from agentrl.run.runtime import assemble
    from agentrl.runfolder import CONFIG, TRACE

    console = Console()
    out_dir = out or Path("runs") / f"rollout-{time.strftime('%Y%m%d-%H%M%S')}"
    groups: list[TrajectoryGroup] = []

    async def main() -> float:
        run = await anyio.to_thread.run_sync(lambda: assemble(cfg, "rollout", split=split))
        t0 = time.perf_counter()
        async with run, JsonlSink(out_dir / TRACE) as sink:
            with Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            ) as progress:
                bar = progress.add_task("rollout", total=tasks)

                async def emit(group: TrajectoryGroup) -> None:
                    await sink(group)
                    groups.append(group)
                    progress.advance(bar)

                await run.engine.produce(tasks, emit)
        return time.perf_counter() - t0

    with exit_on_user_error():
        cfg = load_run_config(config, set_ or [], "rollout")
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / CONFIG).write_text(cfg.to_yaml())
        elapsed = anyio.run(main)
    stats = summarize(groups)
    stats["wall_s"] = elapsed
    stats["episodes_per_s"] = stats["trajectories"] / elapsed if elapsed > 0 else float("nan")
    _print_summary(console, stats)
    console.print(f"wrote {out_dir / 'trajectories.jsonl'}  (inspect: agentrl inspect {out_dir})")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.3f}"
    return str(v)


def _print_summary(console: Console, stats: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title="rollout summary", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("groups", "groups"),
        ("trajectories", "trajectories"),
        ("branches", "branches"),
        ("reward (mean)", "reward_mean"),
        ("success rate", "success_rate"),
        ("turns (mean)", "turns_mean"),
        ("tool calls (mean)", "tool_calls_mean"),
        ("parse errors", "parse_errors"),
        ("infra errors", "infra_errors"),
        ("truncated", "truncated"),
        ("prefix breaks (gateway)", "prefix_breaks"),
        ("tokens (mean)", "tokens_mean"),
        ("latency p50 (s)", "latency_p50_s"),
        ("latency p95 (s)", "latency_p95_s"),
        ("episodes/s", "episodes_per_s"),
    ]
    for label, key in rows:
        table.add_row(label, _fmt(stats.get(key)))
    console.print(table)


# --- inspect ------------------------------------------------------------------------------

TRAINED = "bold green"
MASKED = "dim cyan"
PROMPT = "dim"


def _segment_panel(seg: Any, title: str, style: str) -> Any:
    from rich.panel import Panel
    from rich.text import Text

    body = seg.text if seg.text is not None else f"<{len(seg)} tokens: {seg.token_ids[:12]}...>"
    return Panel(Text(body, style=style), title=title, title_align="left", border_style=style)


def _tree(group: TrajectoryGroup, selected: str) -> Any:
    from rich.tree import Tree

    def label(t: Trajectory) -> str:
        mark = " [reverse]<- shown[/reverse]" if t.traj_id == selected else ""
        where = f" @token {t.branch_position}" if t.parent_id is not None else ""
        return f"{t.traj_id}{where}  reward={t.reward:.3f}  {t.status}{mark}"

    root = Tree(f"group {group.group_id} (task {group.task_id}, {len(group.trajectories)} paths)")
    nodes: dict[str, Any] = {}
    pending = list(group.trajectories)
    for _ in range(len(pending) + 1):  # parents appear before children; tolerate any order
        rest = []
        for t in pending:
            parent = root if t.parent_id is None else nodes.get(t.parent_id)
            if parent is None:
                rest.append(t)
                continue
            nodes[t.traj_id] = parent.add(label(t))
        pending = rest
        if not pending:
            break
    return root


def show_trajectory(console: Console, group: TrajectoryGroup, traj: Trajectory) -> None:
    """Print one trajectory turn by turn (trained tokens vs masked observation tokens)."""
    from rich.table import Table
    from rich.text import Text

    header = Table.grid(padding=(0, 2))
    header.add_row("task", traj.task_id, "trajectory", traj.traj_id)
    header.add_row("status", traj.status, "reward", f"{traj.reward:.4f}")
    header.add_row(
        "tokens",
        f"{traj.num_tokens} ({traj.num_model_tokens} trained)",
        "turns",
        str(len(traj.turns)),
    )
    if traj.parent_id is not None:
        header.add_row("branch of", traj.parent_id, "at token", str(traj.branch_position))
    gateway = traj.metadata.get("gateway")
    if gateway:  # an agent program's episode: which sample, and why it started
        header.add_row(
            "gateway",
            f"sample {gateway['sample'] + 1} of {gateway['samples']}",
            "prefix breaks",
            str(gateway["prefix_breaks"]),
        )
        header.add_row("started by", gateway["started_by"], "calls", str(gateway["calls"]))
        if len(gateway.get("tree", [])) > 1:  # how the episode's samples relate
            from agentrl.gateway.tree import format_tree

            lines = format_tree(gateway["tree"], gateway.get("credit", "all"))
            header.add_row("session tree", "\n".join(lines), "", "")
    if traj.error:
        header.add_row("error", Text(traj.error, style="red"), "", "")
    console.print(header)
    legend = Text()
    legend.append("legend: ")
    legend.append("trained (model) tokens", style=TRAINED)
    legend.append("  ")
    legend.append("masked observation tokens", style=MASKED)
    legend.append("  ")
    legend.append("prompt (masked)", style=PROMPT)
    console.print(legend)

    turn_index = 0
    pos = 0
    for seg in traj.segments:
        start, pos = pos, pos + len(seg)
        shared = traj.branch_position is not None and start < traj.branch_position
        tag = " (shared prefix)" if shared else ""
        if seg.kind == "prompt":
            console.print(_segment_panel(seg, f"prompt · {len(seg)} tokens{tag}", PROMPT))
        elif seg.kind == "model":
            turn = traj.turns[turn_index] if turn_index < len(traj.turns) else None
            versions = sorted(set(seg.versions or []))
            mean_lp = sum(seg.logprobs or [0.0]) / max(len(seg), 1)
            forced = seg.forced or 0  # placed by tool_choice, not trained
            trained = f"{len(seg) - forced} trained tokens" + (
                f" after {forced} forced (tool_choice, masked)" if forced else ""
            )
            title = (
                f"turn {turn_index} · model · {trained} · versions {versions}"
                f" · mean logprob {mean_lp:.3f}"
                + (f" · {turn.finish_reason}" if turn else "")
                + (
                    f" · step reward {turn.step_reward:g}"
                    if turn and turn.step_reward is not None
                    else ""
                )
                + (
                    f" · process reward {turn.process_reward:g}"
                    if turn and turn.process_reward is not None
                    else ""
                )
                + (f" · state {turn.state}" if turn and turn.state is not None else "")
                + tag
            )
            console.print(_segment_panel(seg, title, TRAINED))
            if turn is not None and (turn.tool_calls or turn.parse_errors):
                calls = Table(title=f"turn {turn_index} tool calls", show_lines=False)
                for col in ("tool", "arguments", "result chars", "latency s", "error"):
                    calls.add_column(col)
                for c in turn.tool_calls:
                    calls.add_row(
                        c.name,
                        str(c.arguments)[:80],
                        str(c.result_chars),
                        f"{c.latency_s:.3f}",
                        Text(("INFRA " if c.infra_error else "") + (c.error or ""), style="red"),
                    )
                for err in turn.parse_errors:
                    calls.add_row("(parse)", "", "", "", Text(err, style="red"))
                console.print(calls)
            turn_index += 1
        else:
            console.print(
                _segment_panel(seg, f"observation · {len(seg)} masked tokens{tag}", MASKED)
            )
    if any(t.step_reward is not None for t in traj.turns):
        steps = ", ".join(
            "-" if t.step_reward is None else f"{t.step_reward:g}" for t in traj.turns
        )
        console.print(f"step rewards by turn: [{steps}] (outcome {traj.reward:g})")
    if traj.reward_info:
        console.print(f"reward info: {traj.reward_info}")
    if group.is_tree:
        console.print(_tree(group, traj.traj_id))


def inspect(
    path: Annotated[Path, typer.Argument(help="trajectories.jsonl or a run folder")],
    index: Annotated[int, typer.Option("--index", "-i", help="trajectory number (0-based)")] = 0,
) -> None:
    """Show one trajectory turn by turn: trained vs masked tokens, tool calls, reward, tree."""
    from rich.console import Console

    from agentrl.rollout.sinks import read_groups

    console = Console()
    with exit_on_user_error():
        groups = read_groups(path)
    flat = [(g, t) for g in groups for t in g.trajectories]
    if not flat:
        typer.secho(f"error: {path} holds no trajectories", fg="red", err=True)
        raise typer.Exit(2)
    if not 0 <= index < len(flat):
        typer.secho(
            f"error: --index {index} is out of range: {path} holds {len(flat)} trajectories "
            f"(use 0..{len(flat) - 1})",
            fg="red",
            err=True,
        )
        raise typer.Exit(2)
    group, traj = flat[index]
    console.print(f"trajectory {index} of {len(flat)} ({len(groups)} groups)")
    show_trajectory(console, group, traj)


def register(app: typer.Typer) -> None:
    app.command()(rollout)
    app.command()(inspect)
