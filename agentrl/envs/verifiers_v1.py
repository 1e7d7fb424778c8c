"""``env.name: verifiers`` on verifiers 0.4 (``verifiers.v1``: Env, Taskset, Task, Harness).

``id`` is a taskset id (an importable module exporting a ``vf.Taskset`` subclass, and
optionally its ``Env`` and default ``Harness``), as ``vf eval`` takes it; ``args`` are its
``TasksetConfig`` fields and ``env_config`` the rest of the ``EnvConfig``. A module whose
``load_environment(**args)`` returns a ``vf.Env`` works too. Each episode is the env's own
``run_episode(task, ctx)``: its agents' harnesses call verifiers' interception server,
which relays every request to the episode's gateway session. Roles run in the local
``subprocess`` runtime unless ``env_config`` names another. The reward is the mean over
the trainable agents' traces (all traces when none is marked trainable).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import random
from collections.abc import AsyncIterator, Iterator
from statistics import fmean
from typing import Any, ClassVar

from pydantic import ValidationError

from agentrl.envs.verifiers_api import (
    Target,
    VerifiersOptions,
    call_load,
    find_target,
    kind_of,
    no_module,
    release_text,
    short,
)
from agentrl.errors import ConfigError, EnvError, InfraError

# what a taskset's loading raises for a bad field, a missing module or a wrong type
_LOAD_ERRORS = (ValidationError, ValueError, TypeError, ModuleNotFoundError, AttributeError)


def load(config: VerifiersOptions) -> Any:
    """The ``vf.Env`` that ``id`` names (a taskset, or a load_environment returning one)."""
    v1 = importlib.import_module("verifiers.v1")
    vf = importlib.import_module("verifiers")
    try:
        target = find_target(config)
        if target.load is None:
            return _load_taskset(v1, target, config)
        env = call_load(target, config)
    except AttributeError as e:
        if e.obj is not vf:  # an attribute of the verifiers package itself: the 0.3 API
            raise
        raise ConfigError(
            f"env.options.id={config.id!r} uses the classic verifiers 0.3 API (verifiers."
            f"{e.name} is not in verifiers {release_text()}, which has only verifiers.v1): pin "
            "verifiers<0.4 for this environment, or port it to a vf.Taskset (docs/ecosystem.md)"
        ) from None
    if isinstance(env, v1.Env):
        return env
    kind = kind_of(env)
    if kind.startswith("verifiers."):
        raise ConfigError(
            f"{target.label} built a {kind}, from the classic verifiers 0.3 API, but the "
            f"installed verifiers {release_text()} has only verifiers.v1: pin "
            "verifiers<0.4 for this environment (docs/ecosystem.md)"
        )
    raise ConfigError(f"{target.label}: load_environment returned {kind}, not a vf.Env")


def _load_taskset(v1: Any, target: Target, config: VerifiersOptions) -> Any:
    """``vf.load_environment`` on an EnvConfig: the taskset with ``args``, ``env_config``
    around it, every role in the local subprocess runtime unless set."""
    if not _is_taskset(config.id):
        if target.module is None:
            raise no_module(target, config)
        raise ConfigError(
            f"{target.label}: module {target.module_name!r} has no load_environment() and "
            "exports no vf.Taskset; give 'package.module:function' naming the function that "
            "builds it"
        )
    data = copy.deepcopy(config.env_config)
    if "taskset" in data:
        raise ConfigError(
            "env.options.env_config.taskset: give the taskset's fields in env.options.args "
            "(and its id in env.options.id)"
        )
    data["taskset"] = {**config.args, "id": config.id}
    try:
        fields = importlib.import_module("verifiers.v1.configs.agent").agent_config_fields
        for role in fields(v1.resolve_env_config(copy.deepcopy(data))):
            seat = data.setdefault(role, {})
            if isinstance(seat, dict) and "runtime" not in seat:
                seat["runtime"] = {"type": "subprocess"}
        return v1.load_environment(v1.resolve_env_config(data))
    except _LOAD_ERRORS as e:
        if isinstance(e, ValidationError) and e.errors():  # the field and what is wrong
            err = e.errors()[0]
            first = f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}"
        else:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(
            f"{target.label} (a verifiers.v1 taskset): {first}; its fields go in "
            "env.options.args, the env's and roles' in env.options.env_config"
        ) from None


def _is_taskset(target: str) -> bool:
    """Whether verifiers' own loader finds a Taskset for ``target`` (its tasksets or an
    importable module exporting one via ``__all__``)."""
    loaders = importlib.import_module("verifiers.v1.utils.loaders")
    try:
        loaders.taskset_class(target)
    except (ModuleNotFoundError, TypeError, AttributeError):
        return False
    return True


class V1Adapter:
    """A loaded ``vf.Env``: its tasksets' tasks, one ``run_episode`` per episode."""

    # ids of the vf.Envs whose servers are up (one run-wide serving per loaded env, however
    # many agentrl environments share it: train and eval)
    _served: ClassVar[set[int]] = set()

    def __init__(self, env: Any, config: VerifiersOptions) -> None:
        self.v1 = importlib.import_module("verifiers.v1")
        self.env = env
        self.config = config
        self._tasksets: dict[str, Any] = {}  # split -> the taskset its tasks come from

    def _taskset(self, split: str) -> Any:
        taskset = self._tasksets.get(split)
        if taskset is not None:
            return taskset
        taskset = self.env.taskset
        if split != "train" and self.config.eval_args is not None:
            fields = {**self.config.args, **self.config.eval_args}
            config = type(taskset.config).model_validate({**fields, "id": taskset.config.id})
            taskset = self.v1.load_taskset(config)
        self._tasksets[split] = taskset
        return taskset

    def tasks(self, split: str, seed: int) -> Iterator[dict[str, Any]]:
        taskset = self._taskset(split)
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

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        key = id(self.env)
        if key in self._served:  # another agentrl environment on this vf.Env serves it
            yield
            return
        self._served.add(key)
        try:
            async with self.env.serving():
                yield
        finally:
            self._served.discard(key)

    async def program(self, client: Any, task: dict[str, Any]) -> dict[str, Any]:
        row = task.get("vf_task")
        if not isinstance(row, dict):
            raise EnvError(f"task {task.get('id')!r} has no vf_task (not a verifiers.v1 task)")
        taskset = self._taskset(str(task.get("vf_split", "train")))
        task_cls = type(taskset).task_type()
        vf_task = task_cls(task_cls.data_type().model_validate(row), taskset.config.task)
        ctx = self.v1.ModelContext(
            model=self.config.model,
            # the session's key is in the URL; the relay's Authorization header is unused
            client=self.v1.EvalClientConfig(
                base_url=str(client.base_url), api_key_var="AGENTRL_VERIFIERS_UNUSED_KEY"
            ),
            sampling=self.v1.Sampling(**self.config.sampling_args),
        )
        if id(self.env) in self._served:  # the run's servers (interception, shared tools)
            episode = await self.env.run_episode(vf_task, ctx)
        else:  # outside a run: the env's servers for this one episode
            async with self.env.serving():
                episode = await self.env.run_episode(vf_task, ctx)
        if not episode.ok or not episode.traces:
            errors = [*episode.errors, *(e for t in episode.traces for e in t.errors)]
            why = f"{errors[-1].type}: {errors[-1].message}" if errors else "no trace"
            raise InfraError(f"the verifiers episode failed: {short(why)}")
        traces = episode.traces
        scored = [t for t in traces if t.agent.trainable] or traces
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


Adapter = V1Adapter  # what agentrl.envs.verifiers_env builds for this API
