"""The one generic registry and the one ``module:attr`` loader every plug-in point uses.

    ADVANTAGES = Registry("advantage")          # a name -> function table (agentrl.algos)
    fn = load_object("my_pkg.rewards:exact", "reward function")   # or "file.py:exact"

Unknown names raise :class:`agentrl.errors.UnknownNameError` with close-name suggestions;
a path that does not import is a :class:`agentrl.errors.PluginError` naming what it was for.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from agentrl._suggest import suggest
from agentrl.errors import PluginError, UnknownNameError

F = TypeVar("F", bound=Callable[..., Any])


class Registry(Generic[F]):
    """A small registry of functions of one kind (advantage, policy loss, KL, ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._fns: dict[str, F] = {}

    def register(self, name: str, *, override: bool = False) -> Callable[[F], F]:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string (got {name!r})")

        def deco(fn: F) -> F:
            if name in self._fns and not override and self._fns[name] is not fn:
                raise ValueError(
                    f"{self.kind} '{name}' is already registered; pick another name "
                    "or pass override=True to replace it"
                )
            self._fns[name] = fn
            return fn

        return deco

    def get(self, name: str) -> F:
        try:
            return self._fns[name]
        except (KeyError, TypeError):
            hint = suggest(str(name), self._fns)
            raise UnknownNameError(
                f"unknown {self.kind} '{name}'{hint}; registered: {', '.join(self.names())}"
                f" (add your own with @register_{self.kind.replace(' ', '_')}('{name}'))"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._fns)

    def __contains__(self, name: object) -> bool:
        return name in self._fns


def load_object(target: str, what: str = "environment") -> Any:
    """Import ``package.module:attr`` (dots in `attr` walk attributes); errors name `what`."""
    module_name, _, attr = target.rpartition(":")
    if not module_name or not attr:
        raise PluginError(
            f"{what} path {target!r} must look like 'package.module:name' or 'file.py:name'"
        )
    try:
        module = (
            _import_file(Path(module_name))
            if module_name.endswith(".py")
            else _import_module(module_name)
        )
    except ImportError as e:
        raise PluginError(
            f"cannot import module {module_name!r} for {what} {target!r}: {e}. "
            f"Check the module is installed, on PYTHONPATH or under {os.getcwd()}"
        ) from e
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            names = [n for n in dir(module) if not n.startswith("_")]
            raise PluginError(
                f"module {module_name!r} has no attribute {attr!r}{suggest(attr, names)}"
            ) from None
    return obj


def _import_module(name: str) -> Any:
    """Import `name`, also from the working directory, as ``python -m`` would: the
    ``agentrl`` console script's path starts at its own folder, so a user's ``my_envs/``
    next to the config would not be found. Tried last, so it never shadows an installed
    module."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        cwd = os.getcwd()
        on_path = {os.path.abspath(p or ".") for p in sys.path}
        if e.name != name.split(".")[0] or cwd in on_path:
            raise
        sys.path.append(cwd)
        importlib.invalidate_caches()
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as again:
            if again.name == e.name:  # not there either: leave the path as it was
                sys.path.remove(cwd)
            raise


def _import_file(path: Path) -> Any:
    """Import a Python file as a module (its folder goes on sys.path for its own imports)."""
    if not path.is_file():
        raise ImportError(f"no such file {str(path)!r} (relative to {Path.cwd()})")
    name = f"agentrl_plugin_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.resolve().parent))
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
