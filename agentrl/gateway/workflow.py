"""The episode of an agent program: the workflow the run assembly picks for ``env.name: agent``.

Per episode: open a session on the run's gateway (started once, in the run's resource
scope), run the program against the session's base URL and key, close the session, and
return its samples -- one trajectory when every call extended the conversation, more when
the program broke its prefix -- all with the episode's reward. Limits are the rollout's:
``episode_timeout_s`` (the program is killed), ``max_turns`` model calls and
``max_tokens`` response tokens per sample (a call beyond them is refused and the episode
ends ``truncated``), ``infra_retries`` for programs that crash.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

from agentrl.envs.agent import AgentEnv
from agentrl.errors import ConfigError, InfraError
from agentrl.extras import require
from agentrl.gateway.programs import load_entrypoint, run_command, run_entrypoint
from agentrl.gateway.server import run_gateway
from agentrl.gateway.service import Gateway, GatewaySettings
from agentrl.rollout.workflow import BUILTIN, EpisodeContext, Workflow
from agentrl.run.resources import ResourceScope, current_run_scope
from agentrl.types import Trajectory

HTTP_KEY = "agentrl.gateway.http"


def agent_workflow(env: AgentEnv, base: GatewaySettings, workflow: str = BUILTIN) -> Workflow:
    """The workflow running `env`'s program for each episode of a run whose gateway serves
    with `base` (``rollout.workflow`` is `workflow`).

    `env` is an agent environment (its entrypoint or command), or any environment driven
    from outside that brings its own ``async program(client, task)`` (``env.name:
    verifiers``: the environment's rollout) and ``score(result, task, last_reply)``."""
    if workflow != BUILTIN:
        raise ConfigError(
            f"env.name={env.name} runs its program as the episode; rollout.workflow="
            f"{workflow!r} cannot drive it too: leave rollout.workflow at {BUILTIN}"
        )
    options = env.config
    settings = dataclasses.replace(
        base,
        max_n=options.max_n,
        strict_model=options.strict_model,
        tool_parser=options.tool_parser,
        host=options.host,
        port=options.port,
    )
    entrypoint: Callable[..., Any] | None = getattr(env, "program", None)
    label = env.name
    if entrypoint is None and options.entrypoint is not None:
        entrypoint = load_entrypoint(options.entrypoint)  # a bad path fails the assembly
        label = f"agent:{options.entrypoint}"
    elif entrypoint is None:
        label = f"agent:{options.command[0]}"

    async def run_agent(ctx: EpisodeContext) -> list[Trajectory]:
        scope = current_run_scope()
        if scope is None:
            raise ConfigError(
                f"env.name={env.name} serves its program through the run's gateway: run episodes "
                "inside a run (run = agentrl.run.runtime.assemble(cfg, role); async with run: ...)"
            )
        gateway = await run_gateway(scope, ctx.sampler, settings)
        session = gateway.open_session(
            seed=ctx.params.seed, max_calls=ctx.limits.max_turns, max_tokens=ctx.limits.max_tokens
        )
        failure: str | None = None
        try:
            result = await _run_program(env, entrypoint, gateway, session, ctx, scope)
        except InfraError as e:
            if session.truncation is None:
                raise
            result, failure = None, str(e)  # it stopped because it hit a limit: truncated
        finally:
            gateway.close_session(session.key)
        samples = session.trajectories(ctx.trajectory)
        if not samples:
            raise InfraError(
                "the agent program made no model call through the gateway (is it using "
                "OPENAI_BASE_URL / the client it was given?)"
            )
        if failure is None:
            reward, info = env.score(result, ctx.task, session.last_reply)
        elif env.verifier is not None:
            reward, info = env.score(None, ctx.task, session.last_reply)
        else:
            reward, info = 0.0, {}
        if failure is not None:
            info["agent_error"] = failure
        for traj in samples:
            traj.reward, traj.reward_info = reward, dict(info)
        return samples

    run_agent.__name__ = label
    return run_agent


async def _run_program(
    env: AgentEnv,
    entrypoint: Callable[..., Any] | None,
    gateway: Gateway,
    session: Any,
    ctx: EpisodeContext,
    scope: ResourceScope,
) -> Any:
    url = gateway.session_url(session)
    model = gateway.settings.model_names[0]
    if entrypoint is None:
        return await run_command(env.config, ctx.task, url, session.key, model)
    openai = require("openai", "gateway", "an agent entrypoint's OpenAI client")
    http = await scope.get_or_create(HTTP_KEY, _shared_http_client)
    client = openai.AsyncOpenAI(
        base_url=url,
        api_key=session.key,
        http_client=http,
        max_retries=0,  # a retried call would be sampled twice
        timeout=ctx.limits.timeout_s,
    )
    return await run_entrypoint(entrypoint, client, ctx.task)


async def _shared_http_client(stack: contextlib.AsyncExitStack) -> Any:
    """One connection pool for every episode's client (clients are cheap; pools are not)."""
    import httpx

    openai = require("openai", "gateway", "an agent entrypoint's OpenAI client")

    client = openai.DefaultAsyncHttpxClient(
        limits=httpx.Limits(max_connections=4096, max_keepalive_connections=1024)
    )
    stack.push_async_callback(client.aclose)
    return client
