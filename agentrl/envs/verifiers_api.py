"""What ``env.name: verifiers`` shares across verifiers' two APIs: the options, the adapter
contract each API implements (:mod:`agentrl.envs.verifiers_classic` for 0.3,
:mod:`agentrl.envs.verifiers_v1` for 0.4), which API is installed, and finding what
``env.options.id`` names."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from pydantic import Field

from agentrl.envs.base import EnvOptions
from agentrl.errors import ConfigError, PluginError
from agentrl.registry import load_object

V1_RELEASE = (0, 4)  # verifiers.v1 as the API (0.3.x ships only a preview of it)


class VerifiersOptions(EnvOptions):
    id: str  # environment package / module (load_environment), a v1 taskset, or "module:function"
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


class VerifiersAdapter(Protocol):
    """One verifiers API behind ``env.name: verifiers``."""

    def tasks(self, split: str, seed: int) -> Iterator[dict[str, Any]]:
        """The split's tasks (dicts with an 'id'), in a seeded order."""
        ...

    async def program(self, client: Any, task: dict[str, Any]) -> dict[str, Any]:
        """One rollout against `client` (an ``openai.AsyncOpenAI`` on the episode's session):
        ``{"reward", "metrics", "stop_condition", "vf_truncated"}``."""
        ...

    def serving(self) -> AbstractAsyncContextManager[None]:
        """Servers the environment keeps for a whole run (entered once)."""
        ...


def installed_release() -> tuple[int, int] | None:
    """verifiers' (major, minor) release, or None when its metadata is missing."""
    try:
        major, minor = importlib.metadata.version("verifiers").split(".")[:2]
        return int(major), int(minor)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def cache_key(config: VerifiersOptions) -> str:
    """What decides the loaded environment (loading maps its dataset once per process)."""
    fields = [config.id, config.path, config.args, config.env_config]
    return json.dumps(fields, sort_keys=True, default=repr)


@dataclass
class Target:
    """What ``env.options.id`` names: a loader function, else the module it looked in."""

    label: str  # "env.options.id='...'" for messages
    load: Callable[..., Any] | None
    module: ModuleType | None
    module_name: str


def find_target(config: VerifiersOptions) -> Target:
    """Resolve ``id`` (after putting ``path`` on sys.path): ``module:function``, or a
    module (``-`` read as ``_``, as ``vf-eval`` names them) and its load_environment."""
    label = f"env.options.id={config.id!r}"
    if config.path is not None:
        folder = Path(config.path).expanduser().resolve()
        if not folder.is_dir():
            raise ConfigError(
                f"env.options.path={config.path!r} is not a folder; give the folder "
                "that holds the environment's module (or install it and leave path out)"
            )
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    target = config.id
    if ":" in target:
        try:
            load = load_object(target, "verifiers load_environment")
        except PluginError as e:
            raise ConfigError(f"{label}: {e}") from None
        return Target(label, load, None, target.split(":")[0])
    module_name = target.split("/")[-1].split("@")[0].replace("-", "_")
    module = import_optional(module_name)
    load = getattr(module, "load_environment", None) if module is not None else None
    return Target(label, load, module, module_name)


def no_module(target: Target, config: VerifiersOptions) -> ConfigError:
    return ConfigError(
        f"{target.label}: no module {target.module_name!r}; install the environment package "
        f"(pip install {config.id}, or `prime env install` it) or give "
        "'package.module:load_environment'"
    )


def call_load(target: Target, config: VerifiersOptions) -> Any:
    """``load_environment(**args)``; a wrong argument names env.options.args."""
    assert target.load is not None
    try:
        return target.load(**config.args)
    except TypeError as e:
        raise ConfigError(f"env.options.args for {config.id!r}: {e}") from None


def import_optional(module_name: str) -> ModuleType | None:
    """The module, or None when it (not one of its own imports) does not exist."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name.split(".")[0] and e.name != module_name:
            raise
        return None


def short(error: Any) -> str:
    text = error if isinstance(error, str) else json.dumps(error, default=repr)
    return text[:500]


def kind_of(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__name__}"


def release_text() -> str:
    release = installed_release()
    return ".".join(map(str, release)) if release is not None else "?"
