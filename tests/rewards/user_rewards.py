"""Reward functions as a user writes them, for the reward tests (imported by module:name)."""

from __future__ import annotations

import math

import anyio

CALLS: list[str] = []


def mentions_answer(task, completion):
    return float(str(task["answer"]) in completion)


async def short(task, completion, trajectory):
    await anyio.sleep(0)  # a bare checkpoint: an async reward that yields
    return 1.0 if trajectory.num_model_tokens <= 3 else 0.0


def first_token_even(task, completion, trajectory):
    """Learnable by the tiny model (as the parity env's reward)."""
    ids = [t for s in trajectory.segments if s.kind == "model" for t in s.token_ids]
    return (1.0 if ids and ids[0] % 2 == 0 else 0.0), {"level": task["level"]}


def raises(task, completion):
    raise RuntimeError("checker service down")


def returns_str(task, completion):
    return "yes"


def returns_nan(task, completion):
    return math.nan


def needs_four(task, completion, trajectory, extra):
    return 0.0


def says_right(task, turn_text, turn_index):
    """A process reward: 1 for a turn that moves right (per turn, for reward.process)."""
    return 1.0 if "right" in turn_text else 0.0
