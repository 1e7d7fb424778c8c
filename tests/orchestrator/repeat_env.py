"""A reward that pays repetition: the share of a reply's tokens that repeat an earlier one.

A policy trained on it collapses onto a few tokens; the monitors' test forces that collapse
and expects the repetition alert to fire.
"""

from __future__ import annotations

from agentrl.envs.base import AssistantTurn, StepResult
from tests.orchestrator.parity_env import ParityEnv


class RepeatEnv(ParityEnv):
    name = "repeat"

    async def step(self, turn: AssistantTurn) -> StepResult:
        ids = list(turn.token_ids)
        repeated = 1.0 - len(set(ids)) / len(ids) if ids else 0.0
        return StepResult(outcome=repeated, done=True, info={"extracted": f"{repeated:.2f}"})
