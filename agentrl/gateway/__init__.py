"""The OpenAI-compatible gateway: train an agent program that speaks the chat API.

    gateway = await run_gateway(run.scope, run.sampler, gateway_settings(cfg, training=True))
    session = gateway.open_session(seed=0)
    client = openai.AsyncOpenAI(base_url=gateway.session_url(session), api_key=session.key)
    ...                                            # the agent talks to the model
    trajectories = gateway.close_session(session.key).trajectories(template)

Every call is recorded token for token (prompt ids, sampled ids, behaviour log-probs,
weight versions); calls that extend the conversation join one trajectory, a call that
breaks the prefix starts a new sample of the group. See docs/gateway.md.
"""

from agentrl.gateway.protocol import OpenAIError
from agentrl.gateway.recorder import Sample, Session
from agentrl.gateway.server import GatewayServer, create_app, run_gateway
from agentrl.gateway.service import Gateway, GatewaySettings

__all__ = [
    "Gateway",
    "GatewayServer",
    "GatewaySettings",
    "OpenAIError",
    "Sample",
    "Session",
    "create_app",
    "run_gateway",
]
