"""A plug-in agent program (``env.name: tests.gateway.program_plugin:Repeat``): the
AgentProgram protocol without the built-in agent environment."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from agentrl.envs import AgentProgram, EnvOptions, ModelEndpoint


class RepeatOptions(EnvOptions):
    model: str | None = None  # the model name it asks for (None: the endpoint's)


class Repeat(AgentProgram):
    """Asks the model to repeat a word; rewards a reply that contains it."""

    name = "repeat"
    Options = RepeatOptions

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
        for i, word in enumerate(["apple", "pear", "plum", "fig"]):
            yield {"id": f"w{i}", "word": word}

    async def program(self, endpoint: ModelEndpoint, task: dict[str, Any]) -> str:
        client = endpoint.client()
        reply = await client.chat.completions.create(
            model=self.config.model or endpoint.model,
            messages=[{"role": "user", "content": f"Say {task['word']}."}],
        )
        return reply.choices[0].message.content or ""

    def score(self, result: Any, task: dict[str, Any], last_reply: str) -> tuple[float, dict]:
        return float(task["word"] in (result or last_reply)), {"said": result}
