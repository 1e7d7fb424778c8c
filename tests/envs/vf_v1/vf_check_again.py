"""A multi-turn verifiers v1 environment: the add-one taskset, and an Env whose run() is
the user of the exchange (``agent.interaction``): after the model answers it asks it to
check the answer, so each episode has two model turns. Plain verifiers code."""

from __future__ import annotations

import verifiers.v1 as vf
from vf_add_one import AddOneConfig, AddOneTask, AddOneTaskset
from vf_chat_harness import ChatHarness, ChatHarnessConfig


class CheckAgainConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class CheckAgainEnv(vf.Env[CheckAgainConfig]):
    async def run(self, task, agents) -> None:
        async with agents.agent.interaction(task) as interaction:
            segment = await interaction.turn()  # the task's prompt opens the exchange
            if not segment.terminated:
                await interaction.turn("Check your answer and say it again.")


class CheckAgainTaskset(AddOneTaskset):
    pass


__all__ = [
    "AddOneConfig",
    "AddOneTask",
    "ChatHarness",
    "ChatHarnessConfig",
    "CheckAgainConfig",
    "CheckAgainEnv",
    "CheckAgainTaskset",
]
