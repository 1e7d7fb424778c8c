"""`agentrl sandbox check` and `agentrl sandbox exec FILE`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from agentrl.commands._common import key_values

BACKEND_NAMES = ("bwrap", "docker", "subprocess")

sandbox_app = typer.Typer(
    name="sandbox",
    help="Check and use the code-execution sandboxes.",
    no_args_is_help=True,
)


async def _probe(backend: str) -> tuple[bool, str]:
    """Really run code on `backend`; (works, detail)."""
    import time

    from agentrl.errors import AgentRLError
    from agentrl.sandbox import create_sandbox

    extra = {"allow_insecure": True} if backend == "subprocess" else {}
    try:
        sb = create_sandbox(backend, pool_size=0, **extra)
    except AgentRLError as e:
        return False, str(e)
    try:
        t0 = time.perf_counter()
        res = await sb.run("print(6 * 7)", timeout=30)
        cold = time.perf_counter() - t0
        if res.status != "ok" or res.stdout != "42\n":
            return False, f"ran but returned {res.status}: {(res.stderr or res.stdout)[-300:]}"
        async with sb.session() as s:
            await s.run("x = 1")
            warm = (await s.run("x += 1")).wall_s
        note = f"cold start {cold * 1000:.0f} ms, warm call {warm * 1000:.2f} ms"
        if backend == "bwrap":
            from agentrl.sandbox import cgroups

            why = cgroups.problem()
            note += "; per-sandbox memory cgroup" + (f": no, {why}" if why else ": yes")
        if backend == "subprocess":
            note += "; NOT isolated, needs allow_insecure=True"
        return True, note
    except AgentRLError as e:
        return False, str(e)
    finally:
        await sb.close()


@sandbox_app.command("check")
def check() -> None:
    """Show which sandbox backends work on this machine and, for the others, why not."""
    import warnings

    import anyio
    from rich.console import Console
    from rich.table import Table

    table = Table(title="agentrl sandbox backends")
    table.add_column("backend")
    table.add_column("works?")
    table.add_column("details / why not")
    any_secure = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the insecure warning, shown as text
        for name in BACKEND_NAMES:
            works, detail = anyio.run(_probe, name)
            any_secure |= works and name != "subprocess"
            mark = "[green]yes[/green]" if works else "[red]no[/red]"
            if works and name == "subprocess":
                mark = "[yellow]yes (insecure)[/yellow]"
            table.add_row(name, mark, detail)
    console = Console()
    console.print(table)
    if not any_secure:
        console.print("[red]No secure backend works here; install bubblewrap.[/red]")
        raise typer.Exit(1)


@sandbox_app.command("exec")
def exec_file(
    file: Path = typer.Argument(..., help="Python file to run in the sandbox", exists=True),
    backend: str = typer.Option("auto", "--backend", "-b", help="auto, bwrap, docker, subprocess"),
    timeout: float = typer.Option(10.0, "--timeout", "-t", help="wall-time limit in seconds"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
    limit: list[str] = typer.Option([], "--limit", "-l", help="extra limit KEY=VALUE"),
    allow_insecure: bool = typer.Option(False, help="permit the subprocess backend"),
) -> None:
    """Run FILE once in a sandbox and print the result (exit status 0 only when ok)."""
    import sys

    import anyio

    from agentrl.errors import AgentRLError
    from agentrl.sandbox import create_sandbox

    code = file.read_text()
    limits = key_values(limit, "--limit", "memory_mb=256")
    if allow_insecure:
        limits["allow_insecure"] = True

    async def main() -> Any:
        sb = create_sandbox(backend, pool_size=0, **limits)
        try:
            return await sb.run(code, timeout=timeout), sb.backend_name
        finally:
            await sb.close()

    try:
        res, used = anyio.run(main)
    except AgentRLError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps({**res.to_dict(), "backend": used}, ensure_ascii=False))
    else:
        sys.stdout.write(res.stdout)
        sys.stderr.write(res.stderr)
        sys.stdout.flush()
        typer.echo(
            f"[{used}] status={res.status} exit_code={res.exit_code} wall={res.wall_s:.3f}s "
            f"cpu={res.cpu_s:.3f}s" + (" truncated" if res.truncated else ""),
            err=True,
        )
    raise typer.Exit(0 if res.status == "ok" else 1)


def register(app: typer.Typer) -> None:
    app.add_typer(sandbox_app, name="sandbox")
