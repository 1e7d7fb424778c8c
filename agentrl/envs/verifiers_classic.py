"""``env.name: verifiers`` on verifiers 0.3 (the classic ``vf.Environment``: ``SingleTurnEnv``,
``MultiTurnEnv``, ``ToolEnv``, ``StatefulToolEnv`` ...).

``id`` names what ``vf-eval`` loads: a module (``-`` read as ``_``) whose
``load_environment(**args)`` returns the environment, or ``module:function``. Its dataset
supplies the tasks (``get_dataset`` for train, ``get_eval_dataset`` for eval) and each
episode is its ``run_rollout(input, client, model, sampling_args)`` against the gateway
session; tools (``vf.ToolEnv``) go through the gateway's OpenAI ``tools`` support, the
rubric's reward becomes the trajectory's.

The classic ``Environment`` constructor installs SIGINT/SIGTERM handlers for the whole
process (and fails off the main thread). It is built on the main thread (handed to the
event loop's thread from an anyio worker thread, where ``agentrl rollout`` assembles) and
the process's own handlers are put back right after; verifiers' atexit teardown stays.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import random
import signal
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import anyio.from_thread

from agentrl.envs.verifiers_api import (
    VerifiersOptions,
    call_load,
    find_target,
    kind_of,
    no_module,
    release_text,
    short,
)
from agentrl.errors import ConfigError, EnvError, InfraError

T = TypeVar("T")
HANDLED = (signal.SIGINT, signal.SIGTERM)  # what verifiers' constructor would take over


def load(config: VerifiersOptions) -> Any:
    """The classic environment that ``id`` names."""
    target = find_target(config)
    if target.load is None:
        if target.module is None:
            raise no_module(target, config)
        raise ConfigError(
            f"{target.label}: module {target.module_name!r} has no load_environment(); give "
            "'package.module:function' naming the function that builds it"
        )
    env = on_main_thread_keeping_handlers(lambda: call_load(target, config))
    classic = importlib.import_module("verifiers.envs.environment").Environment
    if isinstance(env, classic):
        return env
    kind = kind_of(env)
    if kind.startswith("verifiers.v1"):
        raise ConfigError(
            f"{target.label} built a {kind}: verifiers.v1 environments need verifiers>=0.4 "
            f"(installed: {release_text()}); pip install 'agentrl[verifiers]'"
        )
    raise ConfigError(f"{target.label}: load_environment returned {kind}, not a vf.Environment")


def on_main_thread_keeping_handlers(build: Callable[[], T]) -> T:
    """``build()`` on the main thread, the process's SIGINT/SIGTERM handlers restored after."""
    if threading.current_thread() is threading.main_thread():
        saved = {signum: signal.getsignal(signum) for signum in HANDLED}
        try:
            return build()
        finally:
            for signum, handler in saved.items():
                signal.signal(signum, handler)
    if not _in_anyio_worker_thread():
        raise ConfigError(
            "a verifiers 0.3 environment installs signal handlers while it is built, which "
            "Python allows only on the main thread: build it there (or from an anyio worker "
            "thread, whose event loop runs on the main thread)"
        )
    return anyio.from_thread.run_sync(on_main_thread_keeping_handlers, build)


def _in_anyio_worker_thread() -> bool:
    try:
        anyio.from_thread.check_cancelled()  # a no-op there; RuntimeError anywhere else
    except RuntimeError:
        return False
    return True


class ClassicAdapter:
    """A loaded classic environment: its datasets' rows, one ``run_rollout`` per episode."""

    def __init__(self, env: Any, config: VerifiersOptions) -> None:
        self.vf = importlib.import_module("verifiers")
        self.env = env
        self.config = config

    def tasks(self, split: str, seed: int) -> Iterator[dict[str, Any]]:
        n = self.config.num_tasks or -1
        dataset = self.env.get_dataset(n) if split == "train" else self.env.get_eval_dataset(n)
        if dataset is None:
            raise ConfigError(f"verifiers environment {self.config.id!r} has no {split} dataset")
        order = list(range(len(dataset)))
        if self.config.shuffle:
            random.Random(seed).shuffle(order)
        for i in order:
            row = dict(dataset[i])
            example = row.get("example_id", i)
            yield {"id": f"{self.config.id}/{split}/{example}", "vf_input": row}

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        yield  # a classic environment keeps no servers of its own

    async def program(self, client: Any, task: dict[str, Any]) -> dict[str, Any]:
        row = task.get("vf_input")
        if not isinstance(row, dict):
            raise EnvError(f"task {task.get('id')!r} has no vf_input row (not a verifiers task)")
        wrapped = self.vf.OpenAIChatCompletionsClient(client)
        output = await self.env.run_rollout(
            copy.deepcopy(row), wrapped, self.config.model, dict(self.config.sampling_args)
        )
        out = dict(output)
        if out.get("error"):
            raise InfraError(f"the verifiers rollout failed: {short(out['error'])}")
        return {
            "reward": float(out.get("reward") or 0.0),
            "metrics": {k: float(v) for k, v in (out.get("metrics") or {}).items()},
            "stop_condition": out.get("stop_condition"),
            "vf_truncated": bool(out.get("is_truncated")),
        }


Adapter = ClassicAdapter  # what agentrl.envs.verifiers_env builds for this API
