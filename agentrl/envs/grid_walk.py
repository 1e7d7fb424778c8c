"""A small grid walk where states recur: the environment for step-level credit (GiGPO).

The agent stands on a ``size`` x ``size`` grid and must reach a goal cell, one move a
turn ("up", "down", "left" or "right": the first of these words in its reply). Every
episode of a task starts in the same cell and the grid is small, so the trajectories of a
group pass through the same cells again and again: :meth:`GridWalkEnv.state_key` (the
cell the agent acts from) gives GiGPO its anchor states.

Rewards: 1.0 on reaching the goal (the outcome); optional process rewards per move:
``step_penalty`` (added to every move that does not finish) and ``progress_reward``
(times the change in Manhattan distance to the goal: positive when it moved closer).
A reply without a direction, or a move into the wall, leaves the agent where it was.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from typing import Any

from pydantic import Field

from agentrl.envs.base import AssistantTurn, Environment, EnvOptions, Message, StepResult

MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_MOVE = re.compile(r"\b(up|down|left|right)\b", re.IGNORECASE)

SYSTEM = (
    "You walk on a grid of {size} rows and {size} columns; row 0 is the top, column 0 the "
    "left. Reach the goal cell. Each turn, answer with one move: up, down, left or right."
)


class GridWalkOptions(EnvOptions):
    size: int = Field(3, ge=2, le=9, description="rows and columns of the grid")
    step_penalty: float = 0.0  # process reward of every move that does not reach the goal
    progress_reward: float = 0.0  # process reward per unit of distance gained
    n_tasks: int = Field(200, ge=1, description="tasks per split")


class GridWalkEnv(Environment):
    """Walk to the goal on a small grid; the cell is the state key (states recur)."""

    name = "grid_walk"
    Options = GridWalkOptions
    config: GridWalkOptions

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.pos: tuple[int, int] = (0, 0)
        self.goal: tuple[int, int] = (0, 0)

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
        size = self.config.size
        rng = random.Random(f"grid_walk/{split}/{seed}/{size}")
        cells = [(r, c) for r in range(size) for c in range(size)]
        for i in range(self.config.n_tasks):
            start, goal = rng.sample(cells, 2)
            yield {"id": f"{split}-{seed}-{i}", "start": list(start), "goal": list(goal)}

    def _where(self) -> str:
        return (
            f"You are at row {self.pos[0]}, column {self.pos[1]}. The goal is at row "
            f"{self.goal[0]}, column {self.goal[1]}."
        )

    async def reset(self, task: dict[str, Any]) -> list[Message]:
        size = self.config.size
        self.pos = (int(task["start"][0]), int(task["start"][1]))
        self.goal = (int(task["goal"][0]), int(task["goal"][1]))
        for what, (r, c) in (("start", self.pos), ("goal", self.goal)):
            if not (0 <= r < size and 0 <= c < size):
                raise ValueError(
                    f"task {task.get('id')!r}: {what} {[r, c]} is off a {size}x{size} grid"
                )
        return [
            {"role": "system", "content": SYSTEM.format(size=size)},
            {"role": "user", "content": self._where() + " Your move?"},
        ]

    def state_key(self) -> str:
        return f"{self.pos[0]},{self.pos[1]}"

    def _distance(self) -> int:
        return abs(self.pos[0] - self.goal[0]) + abs(self.pos[1] - self.goal[1])

    async def step(self, turn: AssistantTurn) -> StepResult:
        match = _MOVE.search(turn.text)
        before = self._distance()
        if match is None:
            note = "No move understood (answer up, down, left or right)."
        else:
            dr, dc = MOVES[match.group(1).lower()]
            r, c = self.pos[0] + dr, self.pos[1] + dc
            size = self.config.size
            if 0 <= r < size and 0 <= c < size:
                self.pos = (r, c)
                note = f"You moved {match.group(1).lower()}."
            else:
                note = "That is the wall; you did not move."
        if self.pos == self.goal:
            return StepResult(outcome=1.0, done=True, info={"moves": match is not None})
        process = self.config.step_penalty + self.config.progress_reward * (
            before - self._distance()
        )
        return StepResult(
            observations=[{"role": "user", "content": f"{note} {self._where()} Your move?"}],
            step_reward=process if process else None,
            done=False,
        )
