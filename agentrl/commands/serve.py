"""`agentrl serve`: the gateway on its own, to try an agent by hand against a config's model."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from agentrl.commands._common import SetOpt, flag, optional


def serve(
    config: Annotated[Path, typer.Argument(help="YAML config (its model and sampler serve)")],
    set_: SetOpt = None,
    host: Annotated[str, typer.Option(help="interface to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port (0 = any free port)")] = 8000,
    out: optional(Path, "where the recorded trajectories go on exit", "--out") = None,
    strict_model: flag(
        "--strict-model", "answer model names other than the served ones with 404"
    ) = False,
    checkpoint: optional(
        Path, "serve these weights (a run or checkpoint folder)", "--checkpoint"
    ) = None,
    tinker: flag("--tinker", "serve the Tinker training API instead (docs/tinker.md)") = False,
    state_dir: optional(
        Path, "--tinker: where tinker:// checkpoints are kept", "--state-dir"
    ) = None,
) -> None:
    """Serve the config's model over the OpenAI and Anthropic APIs; each API key is one
    recorded session.

    With --tinker: serve it over the Tinker training API instead (the official tinker SDK
    and tinker-cookbook; one LoRA adapter per training client, docs/tinker.md).

    Point any agent at it (OPENAI_BASE_URL=http://HOST:PORT/v1 for chat completions and
    Responses, ANTHROPIC_BASE_URL=http://HOST:PORT for Messages). On Ctrl-C every session's
    calls are written to OUT/trajectories.jsonl (one group per key) for `agentrl inspect`.
    """
    import anyio
    from rich.console import Console

    from agentrl.errors import AgentRLError
    from agentrl.run.preflight import load_run_config

    console = Console()
    out_dir = out or Path("runs") / f"serve-{time.strftime('%Y%m%d-%H%M%S')}"

    async def main() -> int:
        from agentrl.gateway import GatewayServer
        from agentrl.gateway.service import Gateway
        from agentrl.rollout.sinks import JsonlSink
        from agentrl.run.runtime import assemble, load_checkpoint_into_sampler
        from agentrl.run.settings import gateway_settings
        from agentrl.runfolder import TRACE
        from agentrl.types import Trajectory, TrajectoryGroup

        run = await anyio.to_thread.run_sync(lambda: assemble(cfg, "rollout"))
        async with run:
            if checkpoint is not None:
                version = await load_checkpoint_into_sampler(run, checkpoint)
                console.print(f"weights: {checkpoint} (version {version})")
            settings = gateway_settings(
                cfg,
                training=False,
                host=host,
                port=port,
                open_sessions=True,
                strict_model=strict_model or cfg.gateway.strict_model,
            )
            server = GatewayServer(Gateway(run.sampler, settings))
            url = await server.start()
            run.scope.push(server.close)
            console.print(
                f"serving {', '.join(settings.model_names)} at [bold]{url}/v1[/bold] "
                "(chat completions, completions, responses; Anthropic messages with "
                f"ANTHROPIC_BASE_URL={url}); every API key is one session; Ctrl-C writes "
                "the trajectories and stops"
            )
            try:
                await anyio.sleep_forever()
            finally:
                with anyio.CancelScope(shield=True):
                    gateway = server.gateway
                    gateway.closing = True
                    n = 0
                    async with JsonlSink(out_dir / TRACE) as sink:
                        for key in list(gateway.sessions):
                            session = gateway.close_session(key)
                            gid = f"serve-{n}"
                            template = Trajectory(task_id=key[:16], group_id=gid, traj_id=gid)
                            trajs = session.trajectories(template)
                            if trajs:
                                await sink(
                                    TrajectoryGroup(
                                        task_id=template.task_id, trajectories=trajs, group_id=gid
                                    )
                                )
                                n += 1
                    console.print(f"wrote {n} sessions to {out_dir / 'trajectories.jsonl'}")
        return 0

    try:
        cfg = load_run_config(config, set_ or [], "serve")
        if tinker:
            from agentrl.commands.serve_tinker import serve_tinker

            return serve_tinker(cfg, host, port, state_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        anyio.run(main)
    except KeyboardInterrupt:
        pass
    except AgentRLError as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        raise typer.Exit(2) from None


def register(app: typer.Typer) -> None:
    app.command()(serve)
