"""Finding environments: built-ins by name, plug-ins by entry point, or ``module:Class``.

    env = make_env("code_math", generators=["chain_sum"], size=100)
    env = make_env("my_pkg.my_env:MyEnv")          # any importable class
    env = make_env("my_env")                        # a plug-in's entry point

Plug-ins register in their own package metadata, no change to agentrl needed::

    [project.entry-points."agentrl.envs"]
    my_env = "my_pkg.my_env:MyEnv"
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
from dataclasses import asdict, dataclass
from typing import Any

from agentrl._suggest import suggest
from agentrl.envs.base import Environment
from agentrl.envs.program import AgentProgram, AnyEnvironment
from agentrl.errors import PluginError, UnknownNameError
from agentrl.registry import load_object

ENTRY_POINT_GROUP = "agentrl.envs"

BUILTINS: dict[str, str] = {
    "code_math": "agentrl.envs.code_math:CodeMathEnv",
    "code_tests": "agentrl.envs.code_tests:CodeTestsEnv",
    "repo": "agentrl.envs.repo:RepoEnv",
    "search_qa": "agentrl.envs.search_qa:SearchQAEnv",
    "agent": "agentrl.envs.agent:AgentEnv",
    "dataset": "agentrl.envs.dataset:DatasetEnv",
    "grid_walk": "agentrl.envs.grid_walk:GridWalkEnv",
    # other ecosystems' environments (docs/ecosystem.md); each needs its extra
    "textarena": "agentrl.envs.gym_text:TextArenaEnv",
    "gem": "agentrl.envs.gym_text:GemEnv",
    "verifiers": "agentrl.envs.verifiers_env:VerifiersEnv",
}


@dataclass
class EnvInfo:
    """One row of `agentrl envs list`."""

    name: str
    source: str  # "builtin", "plugin (<distribution>)" or "path"
    target: str  # module:Class
    description: str = ""
    tools: list[str] | None = None
    error: str | None = None  # set when the class could not be loaded
    extra: str | None = None  # the agentrl extra its library comes from (adapters)
    installed: bool | None = None  # whether that library is importable here

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


PROTOCOLS = (Environment, AgentProgram)


def _is_env_class(obj: object) -> bool:
    return isinstance(obj, type) and issubclass(obj, PROTOCOLS)


def load_class(target: str) -> type[AnyEnvironment]:
    """Import ``module:Class`` and check it implements one environment protocol."""
    obj = load_object(target)
    if not _is_env_class(obj):
        raise PluginError(
            f"{target!r} is {obj!r}, not an agentrl.envs.Environment subclass; subclass "
            "Environment or ToolEnvironment (a step environment), or "
            "agentrl.envs.AgentProgram (a program driven through the gateway)"
        )
    return obj  # type: ignore[return-value]


def resolve(name_or_path: str) -> type[AnyEnvironment]:
    """The environment class for a built-in name, an entry-point name or ``module:Class``."""
    if name_or_path in BUILTINS:
        return load_class(BUILTINS[name_or_path])
    if ":" in name_or_path:
        return load_class(name_or_path)
    eps = _entry_points()
    if name_or_path in eps:
        ep = eps[name_or_path]
        try:
            obj = ep.load()
        except Exception as e:
            raise PluginError(
                f"environment plug-in {name_or_path!r} ({ep.value}) failed to load: {e!r}"
            ) from e
        if not _is_env_class(obj):
            raise PluginError(
                f"entry point {name_or_path!r} = {ep.value!r} is not an Environment (or "
                "AgentProgram) subclass"
            )
        return obj
    known = sorted({*BUILTINS, *eps})
    raise UnknownNameError(
        f"unknown environment {name_or_path!r}{suggest(name_or_path, known)}; available: "
        f"{', '.join(known)} (or give a 'package.module:Class' path)"
    )


def make_env(name_or_path: str, **options: Any) -> AnyEnvironment:
    """A configured environment: a built-in name, an ``agentrl.envs`` entry point or a
    ``module:Class`` path. Options go to the class (validated, errors name the option)."""
    return resolve(name_or_path)(**options)


def _describe(info: EnvInfo) -> EnvInfo:
    try:
        cls = load_class(info.target)
    except PluginError as e:
        info.error = str(e)
        return info
    doc = (cls.__doc__ or "").strip().splitlines()
    info.description = doc[0] if doc else ""
    extra, module = getattr(cls, "extra", None), getattr(cls, "module", None)
    if isinstance(extra, str) and extra and isinstance(module, str) and module:
        info.extra = extra  # found, not imported: listing stays fast and side-effect free
        info.installed = _importable(module)
    try:
        info.tools = list(cls.tool_names())
    except Exception as e:  # a plug-in's bug should not break the listing
        info.error = f"tool_names() raised {e!r}"
    return info


def _importable(module: str) -> bool:
    if module in sys.modules:  # imported already (None: blocked)
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def list_envs() -> list[EnvInfo]:
    """Built-ins and installed plug-ins, with their description and tool names."""
    rows = [EnvInfo(name, "builtin", target) for name, target in BUILTINS.items()]
    for name, ep in sorted(_entry_points().items()):
        if name in BUILTINS:
            continue  # a built-in name cannot be shadowed
        dist = getattr(ep, "dist", None)
        source = f"plugin ({dist.name})" if dist is not None else "plugin"
        rows.append(EnvInfo(name, source, ep.value))
    return [_describe(r) for r in rows]
