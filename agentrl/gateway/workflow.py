"""The episode of an agent program: the workflow the run assembly picks for an
:class:`~agentrl.envs.program.AgentProgram` (``env.name: agent``, ``verifiers``).

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
from typing import Any

from agentrl.envs.program import AgentProgram, ModelEndpoint
from agentrl.errors import ConfigError, InfraError
from agentrl.extras import require
from agentrl.gateway.server import run_gateway
from agentrl.gateway.service import Gateway, GatewaySettings
from agentrl.resources import ResourceScope, current_run_scope
from agentrl.rollout.workflow import BUILTIN, EpisodeContext, Workflow
from agentrl.types import Trajectory

HTTP_KEY = "agentrl.gateway.http"


def agent_workflow(
    env: AgentProgram, settings: GatewaySettings, workflow: str = BUILTIN
) -> Workflow:
    """The workflow running `env`'s program for each episode of a run whose gateway serves
    with `settings` (:func:`agentrl.run.settings.gateway_settings`; ``rollout.workflow``
    is `workflow`)."""
    if workflow != BUILTIN:
        raise ConfigError(
            f"env.name={env.name} runs its program as the episode; rollout.workflow="
            f"{workflow!r} cannot drive it too: leave rollout.workflow at {BUILTIN}"
        )
    serving_key = f"agentrl.program.serving.{id(env)}"

    async def run_agent(ctx: EpisodeContext) -> list[Trajectory]:
        scope = current_run_scope()
        if scope is None:
            raise ConfigError(
                f"env.name={env.name} serves its program through the run's gateway: run episodes "
                "inside a run (run = agentrl.run.runtime.assemble(cfg, role); async with run: ...)"
            )
        await scope.get_or_create(serving_key, lambda stack: _serve(env, stack))
        gateway = await run_gateway(scope, ctx.sampler, settings)
        session = gateway.open_session(
            seed=ctx.params.seed, max_calls=ctx.limits.max_turns, max_tokens=ctx.limits.max_tokens
        )
        failure: str | None = None
        try:
            endpoint = await _endpoint(gateway, session, ctx, scope)
            result = await _run_program(env, endpoint, ctx.task)
        except InfraError as e:
            # scored all the same: it stopped at a limit (truncated), or it ran (made calls)
            # and failed with a result to score (a harness's graded workspace)
            graded = getattr(e, "result", None)
            if session.truncation is None and (graded is None or session.calls == 0):
                raise
            result, failure = graded, str(e)
        finally:
            gateway.close_session(session.key)
        samples = session.trajectories(ctx.trajectory, credit=settings.subagent_credit)
        if not samples:
            raise InfraError(
                "the agent program made no model call through the gateway (is it using "
                "OPENAI_BASE_URL / the client it was given?)"
            )
        if failure is None or result is not None:
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

    run_agent.__name__ = env.label
    return run_agent


async def _run_program(env: AgentProgram, endpoint: ModelEndpoint, task: dict[str, Any]) -> Any:
    """The program's result; whatever it raises is an infrastructure failure of its episode."""
    try:
        return await env.program(endpoint, task)
    except InfraError:
        raise
    except Exception as e:
        raise InfraError(f"agent program {env.label!r} raised {e!r}") from e


async def _serve(env: AgentProgram, stack: contextlib.AsyncExitStack) -> bool:
    """The program's run-wide servers, open until the run's scope closes."""
    await stack.enter_async_context(env.serving())
    return True


async def _endpoint(
    gateway: Gateway, session: Any, ctx: EpisodeContext, scope: ResourceScope
) -> ModelEndpoint:
    """The episode's session as the program sees it; clients share one connection pool."""
    url = gateway.session_url(session)
    http = await scope.get_or_create(HTTP_KEY, _shared_http_client)
    timeout_s = ctx.limits.timeout_s

    def make_client() -> Any:
        openai = require("openai", "gateway", "an agent program's OpenAI client")
        return openai.AsyncOpenAI(
            base_url=url,
            api_key=session.key,
            http_client=http,
            max_retries=0,  # a retried call would be sampled twice
            timeout=timeout_s,
        )

    return ModelEndpoint(
        base_url=url,
        api_key=session.key,
        model=gateway.settings.model_names[0],
        timeout_s=timeout_s,
        make_client=make_client,
    )


async def _shared_http_client(stack: contextlib.AsyncExitStack) -> Any:
    """One connection pool for every episode's client (clients are cheap; pools are not)."""
    import httpx

    openai = require("openai", "gateway", "an agent entrypoint's OpenAI client")

    client = openai.DefaultAsyncHttpxClient(
        limits=httpx.Limits(max_connections=4096, max_keepalive_connections=1024)
    )
    stack.push_async_callback(client.aclose)
    return client
