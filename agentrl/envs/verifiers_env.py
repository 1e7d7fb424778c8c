"""``env.name: verifiers`` -- train a Prime Intellect ``verifiers`` environment unchanged.

    env:
      name: verifiers                    # pip install 'agentrl[verifiers]'
      options:
        id: vf-math-python               # an installed environment package (or module)
        args: {num_train_examples: 500}  # keyword arguments of its load_environment()
        # or: id: my_pkg.my_envs:load_environment

Both verifiers stacks are served by this one adapter, whichever release is installed:

* **verifiers 0.4** (``verifiers.v1``: Env, Taskset, Task, Harness, Agent): ``id`` is a
  taskset id (an importable module exporting a ``vf.Taskset`` subclass, and optionally its
  ``Env`` and default ``Harness``), as ``vf eval`` takes it; ``args`` are its
  ``TasksetConfig`` fields and ``env_config`` the rest of the ``EnvConfig`` (env ``id``,
  each role's ``harness`` / ``sampling`` / ``runtime``, timeouts). A module whose
  ``load_environment(**args)`` returns a ``vf.Env`` works too. Each episode is the env's
  own ``run_episode(task, ctx)``: its agents' harnesses call verifiers' interception
  server, which relays every request to the episode's gateway session. Roles run in the
  local ``subprocess`` runtime unless ``env_config`` names another (verifiers' default is
  a remote Prime sandbox). The trace's weighted rewards are the reward (the mean over the
  trainable agents' traces when an env plays several), rewards and metrics go into
  ``reward_info``.
* **verifiers 0.3** (the classic ``vf.Environment``: ``SingleTurnEnv``, ``MultiTurnEnv``,
  ``ToolEnv``, ``StatefulToolEnv`` ...): ``id`` names what ``vf-eval`` loads, a module
  (``-`` read as ``_``) whose ``load_environment(**args)`` returns the environment, or
  ``module:function``. Its dataset supplies the tasks (``get_dataset`` for train,
  ``get_eval_dataset`` for eval) and each episode is its ``run_rollout(input, client,
  model, sampling_args)`` against the gateway session; tools (``vf.ToolEnv``) go through
  the gateway's OpenAI ``tools`` support, the rubric's reward becomes the trajectory's.

Every model call is recorded token for token by the gateway (prefix breaks counted).
This class holds the options, tasks and scoring; it declares ``driven_from_outside``, and
the run assembly runs each episode's :meth:`program` with the gateway's workflow.
"""

from __future__ import annotations

import copy
import importlib
import importlib.metadata
import json
import random
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from statistics import fmean
from typing import Any, ClassVar

from pydantic import Field

from agentrl.envs.base import AssistantTurn, Environment, EnvOptions, Message, StepResult
from agentrl.errors import ConfigError, EnvError, InfraError, PluginError
from agentrl.extras import require
from agentrl.registry import load_object
from agentrl.resources import current_run_scope


class VerifiersOptions(EnvOptions):
    id: str  # environment package / module (load_environment) or "module:function"
    # a folder holding the environment's module when it is not installed as a package
    # (put first on sys.path, relative to the working directory)
    path: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)  # load_environment(**args)
    # the model name the environment's calls ask for: any name reaches the policy
    model: str = "agentrl"
    # passed to rollout(); in training the temperature must be the sampler's (or left out)
    sampling_args: dict[str, Any] = Field(default_factory=dict)
    num_tasks: int | None = Field(None, ge=1)  # the first n rows of the split (None: all)
    # verifiers 0.4 (verifiers.v1): the EnvConfig fields besides the taskset's (env id,
    # roles' harness / sampling / runtime, timeouts), and the taskset fields of the eval
    # split (None: the train tasks)
    env_config: dict[str, Any] = Field(default_factory=dict)
    eval_args: dict[str, Any] | None = None
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
        self.v1 = _v1_api() is not None and isinstance(self.env, _v1_api().Env)
        self._v1_tasksets: dict[str, Any] = {}  # split -> the v1 taskset its tasks come from

    # --- loading -------------------------------------------------------------------------

    def _load(self) -> Any:
        key = json.dumps(
            [self.config.id, self.config.path, self.config.args, self.config.env_config],
            sort_keys=True,
            default=repr,
        )
        with self._lock:
            env = self._loaded.get(key)
            if env is None:
                env = self._loaded[key] = self._load_uncached()
        return env

    def _load_uncached(self) -> Any:
        label = f"env.options.id={self.config.id!r}"
        if self.config.path is not None:
            folder = Path(self.config.path).expanduser().resolve()
            if not folder.is_dir():
                raise ConfigError(
                    f"env.options.path={self.config.path!r} is not a folder; give the folder "
                    "that holds the environment's module (or install it and leave path out)"
                )
            if str(folder) not in sys.path:
                sys.path.insert(0, str(folder))
        try:
            return self._load_target(label)
        except AttributeError as e:
            # a module written for the classic API (vf.SingleTurnEnv ...) under verifiers 0.4
            if not str(e).startswith("module 'verifiers' has no attribute"):
                raise
            raise ConfigError(
                f"{label} uses the classic verifiers 0.3 API ({e}), but the installed "
                f"verifiers {_version(self.vf)} has only verifiers.v1: pin verifiers<0.4 for "
                "this environment, or port it to a vf.Taskset (docs/ecosystem.md)"
            ) from None

    def _load_target(self, label: str) -> Any:
        target = self.config.id
        if ":" in target:
            try:
                load = load_object(target, "verifiers load_environment")
            except PluginError as e:
                raise ConfigError(f"{label}: {e}") from None
        else:
            module_name = target.split("/")[-1].split("@")[0].replace("-", "_")
            module = _import_optional(module_name)
            load = getattr(module, "load_environment", None) if module is not None else None
            if load is None:
                v1 = _v1_api()
                if v1 is not None and _is_v1_taskset(target):
                    return self._load_v1_taskset(v1, target, label)
                if module is None:
                    raise ConfigError(
                        f"{label}: no module {module_name!r}; install the environment package "
                        f"(pip install {target}, or `prime env install` it) or give "
                        "'package.module:load_environment'"
                    )
                raise ConfigError(
                    f"{label}: module {module_name!r} has no load_environment()"
                    + (" and exports no vf.Taskset" if v1 is not None else "")
                    + "; give 'package.module:function' naming the function that builds it"
                )
        _keep_the_run_signal_handlers()
        try:
            env = load(**self.config.args)
        except TypeError as e:
            raise ConfigError(f"env.options.args for {target!r}: {e}") from None
        v1 = _v1_api()
        if v1 is not None and isinstance(env, v1.Env):
            return env
        legacy = self._legacy_environment_class()
        if legacy is None or not isinstance(env, legacy):
            kind = f"{type(env).__module__}.{type(env).__name__}"
            if kind.startswith("verifiers.") and legacy is None:
                raise ConfigError(
                    f"{label} built a {kind}, from the classic verifiers 0.3 API, but the "
                    f"installed verifiers {_version(self.vf)} has only verifiers.v1: pin "
                    "verifiers<0.4 for this environment (docs/ecosystem.md)"
                )
            if kind.startswith("verifiers.v1"):
                raise ConfigError(
                    f"{label} built a {kind}: verifiers.v1 environments need verifiers>=0.4 "
                    f"(installed: {_version(self.vf)}); pip install 'agentrl[verifiers]'"
                )
            raise ConfigError(
                f"{label}: load_environment returned {kind}, not a verifiers Environment"
            )
        return env

    def _load_v1_taskset(self, v1: Any, target: str, label: str) -> Any:
        """``vf.load_environment`` on an EnvConfig: the taskset ``target`` with ``args``,
        ``env_config`` around it, every role in the local subprocess runtime unless set."""
        data = copy.deepcopy(self.config.env_config)
        if "taskset" in data:
            raise ConfigError(
                "env.options.env_config.taskset: give the taskset's fields in env.options.args "
                "(and its id in env.options.id)"
            )
        data["taskset"] = {**self.config.args, "id": target}
        try:
            fields = importlib.import_module("verifiers.v1.configs.agent").agent_config_fields
            roles = fields(v1.resolve_env_config(copy.deepcopy(data)))
            for role in roles:
                seat = data.setdefault(role, {})
                if isinstance(seat, dict) and "runtime" not in seat:
                    seat["runtime"] = {"type": "subprocess"}
            return v1.load_environment(v1.resolve_env_config(data))
        except (ValueError, TypeError, ModuleNotFoundError, AttributeError) as e:
            errors = getattr(e, "errors", None)  # pydantic: the field and what is wrong
            if callable(errors) and errors():
                err = errors()[0]
                first = f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}"
            else:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(
                f"{label} (a verifiers.v1 taskset): {first}; its fields go in "
                "env.options.args, the env's and roles' in env.options.env_config"
            ) from None

    def _legacy_environment_class(self) -> type | None:
        try:
            return importlib.import_module("verifiers.envs.environment").Environment
        except ImportError:
            return None

    # --- tasks ---------------------------------------------------------------------------

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
        if self.v1:
            yield from self._v1_tasks(split, seed)
            return
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

    def _v1_taskset(self, split: str) -> Any:
        taskset = self._v1_tasksets.get(split)
        if taskset is not None:
            return taskset
        taskset = self.env.taskset
        if split != "train" and self.config.eval_args is not None:
            v1 = _v1_api()
            fields = {**self.config.args, **self.config.eval_args}
            config = type(taskset.config).model_validate({**fields, "id": taskset.config.id})
            taskset = v1.load_taskset(config)
        self._v1_tasksets[split] = taskset
        return taskset

    def _v1_tasks(self, split: str, seed: int) -> Iterator[dict[str, Any]]:
        taskset = self._v1_taskset(split)
        if self.config.num_tasks is not None:
            taskset = taskset.take(self.config.num_tasks)
        elif not taskset.bounded:
            raise ConfigError(
                f"verifiers taskset {self.config.id!r} is infinite: set env.options.num_tasks"
            )
        tasks = list(taskset)
        if self.config.shuffle:
            random.Random(seed).shuffle(tasks)
        for task in tasks:
            name = task.data.id if task.data.id is not None else task.data.idx
            yield {
                "id": f"{self.config.id}/{split}/{name}",
                "vf_split": split,
                "vf_task": task.data.model_dump(mode="json", exclude_defaults=True),
            }

    # --- the episode (the gateway workflow calls program, then score) --------------------

    async def program(self, client: Any, task: dict[str, Any]) -> dict[str, Any]:
        """One rollout of the environment against `client` (an ``openai.AsyncOpenAI`` on
        the episode's gateway session); the rubric's reward and metrics."""
        if self.v1:
            return await self._v1_program(client, task)
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

    async def _v1_program(self, client: Any, task: dict[str, Any]) -> dict[str, Any]:
        v1 = _v1_api()
        row = task.get("vf_task")
        if not isinstance(row, dict):
            raise EnvError(f"task {task.get('id')!r} has no vf_task (not a verifiers.v1 task)")
        taskset = self._v1_taskset(str(task.get("vf_split", "train")))
        task_cls = type(taskset).task_type()
        vf_task = task_cls(task_cls.data_type().model_validate(row), taskset.config.task)
        ctx = v1.ModelContext(
            model=self.config.model,
            # the session's key is in the URL; the relay's Authorization header is unused
            client=v1.EvalClientConfig(
                base_url=str(client.base_url), api_key_var="AGENTRL_VERIFIERS_UNUSED_KEY"
            ),
            sampling=v1.Sampling(**self.config.sampling_args),
        )
        scope = current_run_scope()
        if scope is None:  # outside a run: the env's servers for this one episode
            async with self.env.serving():
                episode = await self.env.run_episode(vf_task, ctx)
        else:  # the interception server (and shared tool servers) live as long as the run
            await scope.get_or_create(f"verifiers-serving-{id(self.env)}", self._serve)
            episode = await self.env.run_episode(vf_task, ctx)
        if not episode.ok or not episode.traces:
            errors = [*episode.errors, *(e for t in episode.traces for e in t.errors)]
            why = f"{errors[-1].type}: {errors[-1].message}" if errors else "no trace"
            raise InfraError(f"the verifiers episode failed: {_short(why)}")
        scored = [t for t in episode.traces if t.agent.trainable] or episode.traces
        traces = episode.traces
        metrics: dict[str, float] = {}
        for trace in traces:
            prefix = f"{trace.agent.name}/" if len(traces) > 1 else ""
            values = {**trace.metrics, **{k: r.score for k, r in trace.rewards.items() if r}}
            metrics |= {f"{prefix}{k}": float(v) for k, v in values.items() if v is not None}
        return {
            "reward": fmean(float(t.reward) for t in scored),
            "metrics": metrics,
            "stop_condition": traces[-1].stop_condition,
            "vf_truncated": any(t.is_truncated for t in traces),
        }

    async def _serve(self, stack: Any) -> bool:
        await stack.enter_async_context(self.env.serving())
        return True

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


def _v1_api() -> Any:
    """``verifiers.v1`` as verifiers 0.4 ships it, or None: not installed, or the preview
    of it in 0.3.x (a different, untested API; 0.3 environments use the classic one)."""
    try:
        release = importlib.metadata.version("verifiers")
        major, minor = (int(part) for part in release.split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None
    if (major, minor) < (0, 4):
        return None
    try:
        return importlib.import_module("verifiers.v1")
    except ImportError:
        return None


def _is_v1_taskset(target: str) -> bool:
    """Whether verifiers' own loader finds a Taskset for ``target`` (its tasksets or an
    importable module exporting one via ``__all__``)."""
    loaders = importlib.import_module("verifiers.v1.utils.loaders")
    try:
        loaders.taskset_class(target)
    except (ModuleNotFoundError, TypeError, AttributeError):
        return False
    return True


def _import_optional(module_name: str) -> Any:
    """The module, or None when it (not one of its own imports) does not exist."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name.split(".")[0] and e.name != module_name:
            raise
        return None


def _version(vf: Any) -> str:
    return str(getattr(vf, "__version__", "?"))
