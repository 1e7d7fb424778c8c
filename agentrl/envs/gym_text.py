"""Gym-style text environments from other projects: ``env.name: textarena`` and ``gem``.

    env:
      name: textarena                  # TextArena (pip install 'agentrl[textarena]')
      options: {id: GuessTheNumber-v0} # any single-player game id; options: its kwargs
    env:
      name: gem                        # GEM (pip install 'agentrl[gem]')
      options: {id: "game:GuessTheNumber-v0-easy", options: {}}

One adapter maps ``reset / step`` (observation text in, action text out, rewards, done)
onto agentrl's multi-turn episode: the game's first observation is the user message (its
own prompt, unchanged; ``system_prompt`` adds a system message before it), every model
turn is the action, and what the game answers becomes the next user message. Tasks are
seeds: task ``i`` of a split resets a fresh game with seed ``seed + i`` (the eval split
uses other seeds), so the group of one task plays the same game.

Rewards, each reported once (DESIGN.md §14): the reward of the step that ends the game is
the episode's outcome (TextArena's final reward from ``close()``, GEM's last step reward);
the rewards of the steps before it are step rewards. With ``reward.step_weight: 1`` (the
default) a sequence estimator trains on the game's return, their sum; an episode cut short
by ``rollout.max_turns`` has no outcome and keeps its step rewards. ``reward_info`` keeps
``step_rewards``, the game's reward of every model turn, and ``return``, their sum (the
run logs its mean over finished episodes as ``return_mean``, for both libraries).

The libraries are synchronous: every call into a game runs in a worker thread, off the
event loop. A game that raises is the episode's infrastructure failure (the rollout turns
it into ``EnvError``: retried, then masked), never a crash of the run. The libraries are
imported when the first game is made, so ``agentrl envs list`` works without them.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Any, ClassVar

import anyio
from pydantic import Field

from agentrl._suggest import suggest
from agentrl.envs.base import AssistantTurn, Environment, EnvOptions, Message, StepResult
from agentrl.errors import ConfigError, EnvError
from agentrl.extras import require

EVAL_SEED_OFFSET = 1_000_000  # eval seeds never meet train seeds


class GymTextOptions(EnvOptions):
    id: str  # the library's environment id
    options: dict[str, Any] = Field(default_factory=dict)  # keyword arguments of its make()
    system_prompt: str | None = None  # a system message before the game's own prompt
    seed: int = 0  # task i of the train split plays the game seeded seed + i
    num_tasks: int = Field(1000, ge=1)  # tasks (seeds) per split


class GymTextEnv(Environment):
    """Base of the gym-style adapters: subclasses say how to make, reset and step a game
    (blocking calls; this class runs them in a worker thread)."""

    Options = GymTextOptions
    extra: ClassVar[str] = ""  # the agentrl extra that installs the library
    module: ClassVar[str] = ""  # the library's import name

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.config: GymTextOptions
        self.game: Any = None
        self.done = False
        self.step_rewards: list[float] = []
        self.final: tuple[float, dict[str, Any]] | None = None

    # --- what an adapter provides (blocking; called in a worker thread) ------------------

    @abc.abstractmethod
    def make_game(self) -> Any:
        """A new game object for one episode."""

    @abc.abstractmethod
    def reset_game(self, seed: int) -> str:
        """Reset ``self.game``; the first observation as text."""

    @abc.abstractmethod
    def step_game(self, action: str) -> tuple[str, float | None, bool, dict[str, Any]]:
        """Play `action`: (observation text, step reward or None, done, info)."""

    def close_game(self) -> None:
        """Release the game (an episode cut short by the turn limit ends here)."""

    # --- the environment contract ------------------------------------------------------

    @classmethod
    def library(cls) -> Any:
        return require(cls.module, cls.extra, f"env.name={cls.name}")

    def check_id(self, label: str) -> None:
        """A ConfigError naming close ids when the library has no environment `id`."""
        from importlib import import_module

        self.library()  # the one-line MissingExtra first
        registry = import_module(f"{self.module}.envs.registration").ENV_REGISTRY
        if self.config.id not in registry:
            raise ConfigError(
                f"env.options.id={self.config.id!r} is not a {label} environment"
                f"{suggest(self.config.id, list(registry))} ({self.module} lists them in "
                f"{self.module}.envs.registration.ENV_REGISTRY)"
            )

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
        base = self.config.seed + (EVAL_SEED_OFFSET if split != "train" else 0)
        for i in range(self.config.num_tasks):
            yield {"id": f"{self.config.id}#{base + i}", "env_id": self.config.id, "seed": base + i}

    async def reset(self, task: dict[str, Any]) -> list[Message]:
        seed = int(task.get("seed", self.config.seed))

        def start() -> str:
            self.game = self.make_game()
            return self.reset_game(seed)

        text = await anyio.to_thread.run_sync(start)
        self.done, self.step_rewards, self.final = False, [], None
        messages: list[Message] = []
        if self.config.system_prompt:
            messages.append({"role": "system", "content": self.config.system_prompt})
        messages.append({"role": "user", "content": text})
        return messages

    async def step(self, turn: AssistantTurn) -> StepResult:
        if self.game is None or self.done:
            raise EnvError(f"{type(self).__name__}.step called before reset or after the end")
        text, reward, done, info = await anyio.to_thread.run_sync(self.step_game, turn.text)
        self.step_rewards.append(0.0 if reward is None else float(reward))
        if done:
            self.done = True
            info = {**info, **self._paid()}
            self.final = (self.step_rewards[-1], info)  # the last step's reward: the outcome
            return StepResult(outcome=self.final[0], done=True, info=info)
        if not text.strip():
            text = "(no observation)"  # an empty user turn would end the episode as stuck
        return StepResult(observations=[{"role": "user", "content": text}], step_reward=reward)

    async def reward(self, trajectory: Any) -> tuple[float, dict[str, Any]] | None:
        if self.final is not None:
            return self.final
        if self.step_rewards:  # cut short (max_turns): no outcome; the step rewards stand
            return 0.0, self._paid()
        return None

    def _paid(self) -> dict[str, Any]:
        """What the game paid: per model turn, and the return (each payment once)."""
        return {"step_rewards": list(self.step_rewards), "return": sum(self.step_rewards)}

    async def close(self) -> None:
        if self.game is not None:
            try:
                await anyio.to_thread.run_sync(self.close_game)
            finally:
                self.game = None


# --- TextArena ---------------------------------------------------------------------------


class TextArenaEnv(GymTextEnv):
    """A TextArena single-player game (ta.make); the final reward from close()."""

    name = "textarena"
    extra = "textarena"
    module = "textarena"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.check_id("TextArena")

    def make_game(self) -> Any:
        game = self.library().make(self.config.id, **self.config.options)
        inner = game
        while hasattr(inner, "env"):  # the observation wrappers repeat the whole history
            inner = inner.env
        self.inner = inner  # read new observations here; act through the wrappers
        return game

    def reset_game(self, seed: int) -> str:
        self.game.reset(num_players=1, seed=seed)
        return self._observation()

    def _observation(self) -> str:
        player, items = self.inner.get_observation()
        parts = []
        for item in items or []:
            if isinstance(item, tuple) and len(item) >= 2:
                sender, message = item[0], item[1]
                if sender == player:
                    continue  # the model's own action, echoed back
                parts.append(str(message).strip())
            else:
                parts.append(str(item).strip())
        return "\n".join(p for p in parts if p)

    def step_game(self, action: str) -> tuple[str, float | None, bool, dict[str, Any]]:
        done, info = self.game.step(action)
        if not done:
            return self._observation(), None, False, dict(info or {})
        game, self.game = self.game, None  # closed here: close() has nothing to release
        rewards, game_info = game.close()
        reward = float((rewards or {}).get(0, 0.0))
        details = dict((game_info or {}).get(0, {}))
        return "", reward, True, {"game": _jsonable(details)}

    def close_game(self) -> None:
        self.game.close()


# --- GEM -----------------------------------------------------------------------------------


class GemEnv(GymTextEnv):
    """A GEM environment (gem.make): games, reasoning-gym tasks. Every step's reward is
    reported once: the last one as the outcome, the earlier ones as step rewards (module
    doc); the game's return is their sum."""

    name = "gem"
    extra = "gem"
    module = "gem"
    TERMINAL = "<｜TERMINAL_STATE｜>"  # GEM's observation after a single-turn episode ends

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.check_id("GEM")

    def make_game(self) -> Any:
        return self.library().make(self.config.id, **self.config.options)

    @classmethod
    def _text(cls, observation: Any, info: dict[str, Any] | None) -> str:
        text = "" if observation == cls.TERMINAL else str(observation)
        suffix = (info or {}).get("suffix")
        return f"{text}\n{suffix}" if suffix else text

    def reset_game(self, seed: int) -> str:
        observation, info = self.game.reset(seed=seed)
        return self._text(observation, info)

    def step_game(self, action: str) -> tuple[str, float | None, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.game.step(action)
        done = bool(terminated or truncated)
        details = {k: v for k, v in (info or {}).items() if k != "suffix"}
        if done:
            details["truncated_by_env"] = bool(truncated and not terminated)
        return self._text(observation, info), float(reward), done, _jsonable(details)

    def close_game(self) -> None:
        close = getattr(self.game, "close", None)
        if close is not None:
            close()


def _jsonable(value: Any) -> Any:
    """The library's info as plain JSON values (the trace is JSON)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)
