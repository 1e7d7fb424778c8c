"""Reward functions as plain Python: ``reward.functions: [my_pkg.rewards:correct, ...]``.

    def correct(task, completion, trajectory):      # sync or async, 1 to 3 parameters
        return float(task["answer"] in completion)

A function gets, positionally, as many of these as it takes: the task (every dataset
column), the final answer text (the last assistant turn) and the
:class:`~agentrl.types.Trajectory` (tokens, turns, tool calls). It returns a number (or a
``(number, info dict)`` pair). A function that raises fails that episode as an
infrastructure error (retried, then masked from the loss and counted); one that returns a
string, None or NaN stops the run with a message naming it: nothing is trained on a
reward that is not a number.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

from agentrl.errors import ConfigError, InfraError, RewardError
from agentrl.registry import load_object

ARGUMENTS = ("task", "completion", "trajectory")


class RewardFunctionFailed(InfraError):
    """A reward function raised: the episode is an infrastructure error, not a bad answer."""


@dataclass
class RewardFunction:
    """A user's function, its weight and how many of :data:`ARGUMENTS` it takes."""

    fn: Callable[..., Any]
    name: str
    weight: float
    target: str
    n_args: int
    is_async: bool

    @classmethod
    def load(cls, target: str | Callable[..., Any], weight: float = 1.0, name: str | None = None):
        """Import ``module:function`` (or take a callable) and check it can be called."""
        if callable(target):
            fn, label = target, getattr(target, "__qualname__", repr(target))
        else:
            fn, label = load_object(target, "reward function"), target
            if not callable(fn):
                raise ConfigError(
                    f"reward.functions: {target!r} is {type(fn).__name__}, not a function; "
                    "point it to 'package.module:function'"
                )
        return cls(
            fn=fn,
            name=name or getattr(fn, "__name__", str(label)),
            weight=float(weight),
            target=str(label),
            n_args=_arity(fn, str(label)),
            is_async=inspect.iscoroutinefunction(fn)
            or inspect.iscoroutinefunction(type(fn).__call__),
        )

    async def __call__(
        self, task: dict[str, Any], completion: str, trajectory: Any
    ) -> tuple[float, dict[str, Any]]:
        args = (task, completion, trajectory)[: self.n_args]
        try:
            if self.is_async:
                out = await self.fn(*args)
            else:  # a slow function (a parser, a checker) must not stall the event loop
                out = await anyio.to_thread.run_sync(lambda: self.fn(*args))
        except Exception as e:
            raise RewardFunctionFailed(
                f"reward function {self.target} raised {type(e).__name__}: {e} "
                f"(task {task.get('id')!r})"
            ) from e
        return check_reward(out, f"reward function {self.target}", task)


def _arity(fn: Callable[..., Any], label: str) -> int:
    """How many of (task, completion, trajectory) `fn` takes positionally."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return len(ARGUMENTS)  # a builtin or C callable: give it everything
    positional, required = 0, 0
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            return len(ARGUMENTS)
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            positional += 1
            required += p.default is p.empty
        elif p.kind is p.KEYWORD_ONLY and p.default is p.empty:
            raise ConfigError(
                f"reward function {label} has a required keyword-only parameter {p.name!r}; "
                f"it is called with up to three positional arguments ({', '.join(ARGUMENTS)})"
            )
    if required > len(ARGUMENTS) or positional == 0:
        raise ConfigError(
            f"reward function {label} takes {required or positional} parameters; it is called "
            f"as fn(task, completion, trajectory) (1 to 3 of them, in that order)"
        )
    return min(positional, len(ARGUMENTS))


def check_reward(out: Any, what: str, task: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """``(reward, info)`` from a function's return value; anything but a finite number is a
    :class:`RewardError` naming `what`, the value and the task."""
    info: dict[str, Any] = {}
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict):
        out, info = out
    where = f"(task {task.get('id')!r})"
    value = _number(out)
    if value is None:
        raise RewardError(
            f"{what} returned {out!r} ({type(out).__name__}) {where}: return a float (or "
            "an int/bool, or (float, info dict))"
        )
    if not math.isfinite(value):
        raise RewardError(
            f"{what} returned {value} {where}: rewards must be finite numbers; "
            "nothing is trained on it"
        )
    return value, info


def _number(out: Any) -> float | None:
    """`out` as a float: a Python or numpy number, or a one-element array or tensor."""
    if isinstance(out, numbers.Real):
        return float(out)
    if hasattr(out, "item") and not isinstance(out, (str, bytes)):
        try:
            item = out.item()  # raises for arrays / tensors of more than one element
        except (ValueError, RuntimeError):
            return None
        return float(item) if isinstance(item, numbers.Real) else None
    return None
