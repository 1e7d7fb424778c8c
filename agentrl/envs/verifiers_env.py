"""``env.name: verifiers`` -- train a Prime Intellect ``verifiers`` environment unchanged.

    env:
      name: verifiers                    # pip install 'agentrl[verifiers]'
      options:
        id: vf-math-python               # an installed environment package (or module)
        args: {num_train_examples: 500}  # keyword arguments of its load_environment()
        # or: id: my_pkg.my_envs:load_environment

One adapter per verifiers API, picked by the installed release:
:mod:`agentrl.envs.verifiers_v1` for verifiers 0.4 (``verifiers.v1``: tasksets, envs,
harnesses) and :mod:`agentrl.envs.verifiers_classic` for 0.3 (the classic
``vf.Environment``). Either way the episode is the environment's own rollout, its model
calls go to the episode's gateway session (recorded token for token, prefix breaks
counted) and its rubric's reward becomes the trajectory's; rewards and metrics go into
``reward_info``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar

from agentrl.envs import verifiers_classic, verifiers_v1
from agentrl.envs.program import AgentProgram, ModelEndpoint
from agentrl.envs.verifiers_api import (
    V1_RELEASE,
    VerifiersAdapter,
    VerifiersOptions,
    cache_key,
    installed_release,
)
from agentrl.extras import require

__all__ = ["VerifiersEnv", "VerifiersOptions"]


class VerifiersEnv(AgentProgram):
    """A verifiers environment (0.3 or 0.4); its rollout and rubric, our gateway."""

    name = "verifiers"
    Options = VerifiersOptions
    extra: ClassVar[str] = "verifiers"
    module: ClassVar[str] = "verifiers"

    # cache_key -> the loaded environment: loading maps its dataset once per process
    _loaded: ClassVar[dict[str, Any]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.config: VerifiersOptions
        require("verifiers", "verifiers", "env.name=verifiers")
        release = installed_release()
        api = verifiers_v1 if release is not None and release >= V1_RELEASE else verifiers_classic
        key = f"{api.__name__}:{cache_key(self.config)}"
        with self._lock:
            env = self._loaded.get(key)
            if env is None:
                env = self._loaded[key] = api.load(self.config)
        self.adapter: VerifiersAdapter = api.Adapter(env, self.config)

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
        return self.adapter.tasks(split, seed)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        async with self.adapter.serving():
            yield

    async def program(self, endpoint: ModelEndpoint, task: dict[str, Any]) -> dict[str, Any]:
        """One rollout of the environment on the episode's session; the rubric's reward and
        metrics."""
        return await self.adapter.program(endpoint.client(), task)

    def score(self, result: Any, task: dict[str, Any], last_reply: str) -> tuple[float, dict]:
        if not isinstance(result, dict) or "reward" not in result:
            return 0.0, {}  # the rollout hit a gateway limit before the rubric ran
        info = {k: v for k, v in result.items() if k != "reward"}
        return float(result["reward"]), info
