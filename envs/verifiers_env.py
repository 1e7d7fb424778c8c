"""``env.name: verifiers`` -- train a Prime Intellect ``verifiers`` environment unchanged.

    env:
      name: verifiers                    # pip install 'agentrl[verifiers]'
      options:
        id: vf-math-python               # an installed environment package (or module)
        args: {num_train_examples: 500}  # keyword arguments of its load_environment()
        # or: id: my_pkg.my_envs:load_environment

``id`` names what ``vf-eval`` loads: a module (``-`` read as ``_``) whose
``load_environment(**args)`` returns the environment, or ``module:function``. Its dataset
supplies the tasks (``get_dataset`` for train, ``get_eval_dataset`` for eval), and each
episode is the environment's own ``run_rollout(input, client, model, sampling_args)``
against the run's gateway: every model call is recorded token for token (prefix breaks
counted), tools (``vf.ToolEnv``) go through the gateway's OpenAI ``tools`` support, and
the rubric's reward becomes the trajectory's reward, its metrics ``reward_info``.

Supported: the classic ``vf.Environment`` stack (``SingleTurnEnv``, ``MultiTurnEnv``,
``ToolEnv``, ``StatefulToolEnv`` ...; verifiers 0.3.x, where it also answers as
``verifiers.legacy``). ``verifiers.v1`` environments (the stack 0.4 moved to) run their
own harnesses and are refused with a clear error (docs/ecosystem.md).

This class holds the options, tasks and scoring; it declares ``driven_from_outside``, and
the run assembly runs each episode's :meth:`program` with the gateway's workflow.
"""

from __future__ import annotations

import copy
import importlib
import json
import random
import signal
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

from pydantic import Field

from agentrl.envs.base import AssistantTurn, Environment, EnvOptions, Message, StepResult
from agentrl.errors import ConfigError, EnvError, InfraError, PluginError
from agentrl.extras import require
from agentrl.registry import load_object


class VerifiersOptions(EnvOptions):
    id: str  # environment package / module (load_environment) or "module:function"
    args: dict[str, Any] = Field(default_factory=dict)  # load_environment(**args)
    # the model name the environment's calls ask for: any name reaches the policy
    model: str = "agentrl"
    # passed to rollout(); in training the temperature must be the sampler's (or left out)
    sampling_args: dict[str, Any] = Field(default_factory=dict)
    num_tasks: int | None = Field(None, ge=1)  # the first n rows of the split (None: all)
    shuffle: bool = True  # tasks in a seeded order (the run's seed)
    # gateway (as for env.name: agent)
    max_n: int = Field(4, ge=1)
    tool_parser: str = "hermes"
    strict_model: bool = False
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)


class VerifiersEnv(Environment):
    """A verifiers environment (load_environment); its rollout and rubric, our gateway."""

    name = "verifiers"
    Options = VerifiersOptions
    driven_from_outside = True  # the environment's rollout drives the gateway
    extra: ClassVar[str] = "verifiers"
    module: ClassVar[str] = "verifiers"
    verifier = None  # the rubric scores inside the rollout

    # (id, args) -> the loaded environment: loading maps its dataset once per process
    _loaded: ClassVar[dict[str, Any]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.config: VerifiersOptions
        self.vf = require("verifiers", "verifiers", "env.name=verifiers")
        self.env = self._load()

    # --- loading -------------------------------------------------------------------------

    def _load(self) -> Any:
        key = json.dumps([self.config.id, self.config.args], sort_keys=True, default=repr)
        with self._lock:
            env = self._loaded.get(key)
            if env is None:
                env = self._loaded[key] = self._load_uncached()
        return env

    def _load_uncached(self) -> Any:
        target = self.config.id
        label = f"env.options.id={target!r}"
        if ":" in target:
            try:
                load = load_object(target, "verifiers load_environment")
            except PluginError as e:
                raise ConfigError(f"{label}: {e}") from None
        else:
            module_name = target.replace("-", "_").split("/")[-1]
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as e:
                if e.name != module_name.split(".")[0] and e.name != module_name:
                    raise
                raise ConfigError(
                    f"{label}: no module {module_name!r}; install the environment package "
                    f"(pip install {target}, or `prime env install` it) or give "
                    "'package.module:load_environment'"
                ) from None
            load = getattr(module, "load_environment", None)
            if load is None:
                raise ConfigError(
                    f"{label}: module {module_name!r} has no load_environment(); give "
                    "'package.module:function' naming the function that builds it"
                )
        _keep_the_run_signal_handlers()
        try:
            env = load(**self.config.args)
        except TypeError as e:
            raise ConfigError(f"env.options.args for {target!r}: {e}") from None
        legacy = self._legacy_environment_class()
        if legacy is None or not isinstance(env, legacy):
            kind = f"{type(env).__module__}.{type(env).__name__}"
            if kind.startswith("verifiers.v1"):
                raise ConfigError(
                    f"{label} built a {kind}: verifiers.v1 environments (the 0.4 stack) are "
                    "not supported yet; use a vf.Environment (SingleTurnEnv, MultiTurnEnv, "
                    "ToolEnv ...), see docs/ecosystem.md"
                )
            raise ConfigError(
                f"{label}: load_environment returned {kind}, not a verifiers Environment"
            )
        return env

    def _legacy_environment_class(self) -> type | None:
        try:
            return importlib.import_module("verifiers.envs.environment").Environment
        except ImportError:
            return None

    # --- tasks ---------------------------------------------------------------------------

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
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

    # --- the episode (the gateway workflow calls program, then score) --------------------

    async def program(self, client: Any, task: dict[str, Any]) -> dict[str, Any]:
        """One rollout of the environment against `client` (an ``openai.AsyncOpenAI`` on
        the episode's gateway session); the rubric's reward and metrics."""
        row = task.get("vf_input")
        if not isinstance(row, dict):
            raise EnvError(f"task {task.get('id')!r} has no vf_input row (not a verifiers task)")
        wrapped = self.vf.OpenAIChatCompletionsClient(client)
        output = await self.env.run_rollout(
            copy.deepcopy(row), wrapped, self.config.model, dict(self.config.sampling_args)
        )
        out = dict(output)
        if out.get("error"):
            raise InfraError(f"the verifiers rollout failed: {_short(out['error'])}")
        info: dict[str, Any] = {
            "metrics": {k: float(v) for k, v in (out.get("metrics") or {}).items()},
            "stop_condition": out.get("stop_condition"),
            "vf_truncated": bool(out.get("is_truncated")),
        }
        return {"reward": float(out.get("reward") or 0.0), **info}

    def score(self, result: Any, task: dict[str, Any], last_reply: str) -> tuple[float, dict]:
        if not isinstance(result, dict) or "reward" not in result:
            return 0.0, {}  # the rollout hit a gateway limit before the rubric ran
        info = {k: v for k, v in result.items() if k != "reward"}
        return float(result["reward"]), info

    async def reset(self, task: dict[str, Any]) -> list[Message]:
        raise EnvError(self._driven)

    async def step(self, turn: AssistantTurn) -> StepResult:
        raise EnvError(self._driven)

    _driven: ClassVar[str] = (
        "the verifiers environment has no reset/step: its own rollout drives the episode "
        "through the gateway (agentrl.gateway.workflow), which the run assembly picks"
    )


class _NoHandlerInstall:
    """Stands in for the ``signal`` module inside verifiers' environment module: its
    constructor installs SIGINT/SIGTERM handlers, which would replace the run's own (and
    fails outright off the main thread, where the run assembles). Everything else is the
    real module; verifiers still tears down at exit (its atexit hook)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(signal, name)

    @staticmethod
    def signal(signum: int, handler: Any) -> Any:
        return signal.getsignal(signum)


def _keep_the_run_signal_handlers() -> None:
    try:
        module = importlib.import_module("verifiers.envs.environment")
    except ImportError:
        return
    if getattr(module, "signal", None) is signal:
        module.signal = _NoHandlerInstall()


def _short(error: Any) -> str:
    text = error if isinstance(error, str) else json.dumps(error, default=repr)
    return text[:500]
