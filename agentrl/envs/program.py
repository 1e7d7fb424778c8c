"""The agent-program contract: an episode that a program drives itself (docs/architecture.md).

An :class:`AgentProgram` does not answer turns (that is :class:`agentrl.envs.Environment`,
``reset`` / ``step``): for each episode the run layer opens a recorded session on an
OpenAI-compatible endpoint (the run's gateway), hands it over as a :class:`ModelEndpoint`,
awaits :meth:`AgentProgram.program` and scores its result with :meth:`AgentProgram.score`.
The run layer picks that workflow by this type (``isinstance(env, AgentProgram)``);
environments never import the gateway.

Built-ins: ``env.name: agent`` (a Python entrypoint or any command) and ``env.name:
verifiers`` (a verifiers environment's own rollout).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from agentrl.envs.base import EnvBase, Environment


@dataclass(frozen=True)
class ModelEndpoint:
    """Where one episode's program reaches the policy: a session of an OpenAI-compatible
    server whose every call is recorded token for token."""

    base_url: str  # ends in /v1; the session's key is part of it
    api_key: str
    model: str  # a name the server answers to
    timeout_s: float  # the episode's time limit
    # an ``openai.AsyncOpenAI`` bound to this session (one shared connection pool, no retries:
    # a retried call would be sampled twice)
    make_client: Callable[[], Any]

    def client(self) -> Any:
        return self.make_client()


class AgentProgram(EnvBase):
    """An episode run by a program that calls the model through a :class:`ModelEndpoint`.

    Subclasses implement :meth:`tasks`, :meth:`program` and :meth:`score`; a program that
    needs servers for the whole run (verifiers' interception server) opens them in
    :meth:`serving`, which the run layer enters once per run.
    """

    # scores the program's answer (agentrl.envs.verifiers.Verifier), or None: the program's
    # result is the reward; an episode cut short by a limit is scored by it on the last reply
    verifier: Any = None

    @property
    def label(self) -> str:
        """How errors and traces name the program."""
        return self.name or type(self).__name__

    @abc.abstractmethod
    async def program(self, endpoint: ModelEndpoint, task: dict[str, Any]) -> Any:
        """Run one episode of `task` against `endpoint`; its result goes to :meth:`score`.
        An exception is an infrastructure failure of this episode only."""

    @abc.abstractmethod
    def score(
        self, result: Any, task: dict[str, Any], last_reply: str
    ) -> tuple[float, dict[str, Any]]:
        """(reward, info) of an episode whose program returned `result` (None: it was cut
        short by a limit); `last_reply` is the model's last reply in the session."""

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """Resources that live as long as the run (entered once, before the first episode)."""
        yield


# what make_env returns: an environment of either protocol
AnyEnvironment = Environment | AgentProgram
