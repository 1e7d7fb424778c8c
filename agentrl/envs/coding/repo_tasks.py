"""Tasks of the ``repo`` environment: generated bug fixes, and a user's repositories.

A task is a JSON-safe dict:

    id            "textkit-longest_word-3"
    prompt        the issue the agent reads
    files         {path: text}: the repository the agent gets (the bug in, tests out)
    hidden_tests  {path: source}: test files the agent never sees
    tests         ["tests/test_words.py::test_longest_word", ...]: must all pass
    packages      top-level modules of the repository
    reference_fix a unified diff that fixes the bug (generated tasks)

Generated tasks follow SWE-smith's recipe on the seed repositories of
``repo_templates.py``: mutate one function (a comparison, an arithmetic operator, a
constant, a boolean operator), keep the mutation when some of the repository's own tests
fail with it (and all pass without it), and ask for the fix. Installed packages here that
ship tests (mpmath, networkx, ...) need pytest, which the sandbox's interpreter lacks, so
the seeds are these templates. A user's tasks: ``load_repo_tasks(path)`` reads a JSONL of
``{"id", "repo": folder or .tar/.tar.gz, "tests": [...], "prompt"}`` (optional
``hidden``: the test files to hide; default every test file of the repository).
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import io
import json
import random
import tarfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentrl.envs.coding.repo_diff import is_test_path, make_diff, safe_path
from agentrl.envs.coding.repo_templates import TEMPLATES
from agentrl.errors import ConfigError

_SWAPS: dict[type, type] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Add,
    ast.FloorDiv: ast.Mult,
    ast.Div: ast.FloorDiv,
    ast.And: ast.Or,
    ast.Or: ast.And,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}


def normalize(source: str) -> str:
    """The source as ``ast.unparse`` writes it (so a mutation's diff is only the bug)."""
    return ast.unparse(ast.parse(source)) + "\n"


def _sites(tree: ast.Module) -> list[tuple[str, int]]:
    """(function name, index of a mutable node in ast.walk order) for every mutation site."""
    sites = []
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        for i, node in enumerate(ast.walk(fn)):
            if _mutable(node):
                sites.append((fn.name, i))
    return sites


def _mutable(node: ast.AST) -> bool:
    if isinstance(node, ast.BinOp | ast.BoolOp):
        return type(node.op) in _SWAPS
    if isinstance(node, ast.Compare):
        return type(node.ops[0]) in _SWAPS
    return isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value <= 1000


def mutate(source: str, function: str, index: int) -> str:
    """``source`` with the node at ``index`` (ast.walk order) of ``function`` mutated."""
    tree = ast.parse(source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    node = list(ast.walk(fn))[index]
    if isinstance(node, ast.BinOp | ast.BoolOp):
        node.op = _SWAPS[type(node.op)]()
    elif isinstance(node, ast.Compare):
        node.ops[0] = _SWAPS[type(node.ops[0])]()
    else:
        assert isinstance(node, ast.Constant)
        node.value = node.value + 1
    return ast.unparse(tree) + "\n"


def run_tests_here(files: dict[str, str], tests: dict[str, str]) -> dict[str, bool]:
    """Run trusted template tests in this process: {test id: passed} (generation only)."""
    modules: dict[str, types.ModuleType] = {}
    for path in sorted(files):
        name = path[: -len(".py")].replace("/", ".")
        if name.endswith(".__init__"):
            name = name[: -len(".__init__")]
        modules[name] = types.ModuleType(name)
    real_import = builtins.__import__

    def _import(
        name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> Any:
        if name in modules:
            return modules[name] if fromlist else modules[name.split(".")[0]]
        return real_import(name, globals, locals, fromlist, level)

    env_builtins = {**vars(builtins), "__import__": _import}
    results: dict[str, bool] = {}
    try:
        for path in sorted(files):
            name = path[: -len(".py")].replace("/", ".").removesuffix(".__init__")
            mod = modules[name]
            mod.__dict__["__builtins__"] = env_builtins
            exec(compile(files[path], path, "exec"), mod.__dict__)
            if "." in name:
                parent, _, child = name.rpartition(".")
                setattr(modules[parent], child, mod)
    except Exception:
        return {f"{p}::{n}": False for p, src in tests.items() for n in _test_names(src)}
    for path, source in tests.items():
        namespace: dict[str, Any] = {"__builtins__": env_builtins, "__name__": "__test__"}
        exec(compile(source, path, "exec"), namespace)
        for name in _test_names(source):
            try:
                namespace[name]()
                results[f"{path}::{name}"] = True
            except Exception:
                results[f"{path}::{name}"] = False
    return results


def _test_names(source: str) -> list[str]:
    tree = ast.parse(source)
    return [
        n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")
    ]


def _candidates(package: str) -> list[dict[str, Any]]:
    """Every validated bug of one seed repository, in a fixed order."""
    template = TEMPLATES[package]
    tests = {p: s for p, s in template.items() if is_test_path(p)}
    original = {p: normalize(s) for p, s in template.items() if p not in tests}
    baseline = run_tests_here(original, tests)
    if not all(baseline.values()):
        raise AssertionError(f"seed repository {package!r} fails its own tests: {baseline}")
    out = []
    for path, source in sorted(original.items()):
        for function, index in _sites(ast.parse(source)):
            buggy_source = mutate(source, function, index)
            if buggy_source == source:
                continue
            buggy = {**original, path: buggy_source}
            results = run_tests_here(buggy, tests)
            failing = sorted(t for t, ok in results.items() if not ok)
            if not failing:
                continue  # an equivalent mutant: no test notices it
            out.append(
                {
                    "package": package,
                    "path": path,
                    "function": function,
                    "site": index,
                    "files": buggy,
                    "failing": failing,
                    "reference_fix": make_diff(buggy, original),
                    "tests": sorted(results),
                    "hidden_tests": tests,
                }
            )
    return out


_CACHE: dict[str, list[dict[str, Any]]] = {}


def all_generated() -> list[dict[str, Any]]:
    """Every validated bug of every seed repository (cached; deterministic order)."""
    if "all" not in _CACHE:
        tasks = []
        for package in sorted(TEMPLATES):
            for k, c in enumerate(_candidates(package)):
                tasks.append(_as_task(c, f"{package}-{c['function']}-{k}"))
        _CACHE["all"] = tasks
    return _CACHE["all"]


def _as_task(c: dict[str, Any], task_id: str) -> dict[str, Any]:
    prompt = (
        f"The repository `{c['package']}` is in /repo. A user reports that "
        f"`{c['function']}` in `{c['path']}` gives wrong results; the project's tests for it "
        f"({', '.join(t.split('::')[1] for t in c['failing'])}) fail. Find the bug and fix the "
        "code. Test files are restored before grading: only changes to the code count."
    )
    return {
        "id": task_id,
        "prompt": prompt,
        "files": c["files"],
        "hidden_tests": c["hidden_tests"],
        "tests": c["tests"],
        "packages": [c["package"]],
        "reference_fix": c["reference_fix"],
        "source": "generated",
    }


def generated_tasks(split: str, seed: int, size: int) -> Iterator[dict[str, Any]]:
    """Generated tasks of ``split``: a stable fifth of the bugs is held out for eval."""
    pool = [t for t in all_generated() if _is_eval(t["id"]) == (split != "train")]
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    for i in order[:size]:
        yield pool[i]


def _is_eval(task_id: str) -> bool:
    return int(hashlib.sha256(task_id.encode()).hexdigest(), 16) % 5 == 0


# --- a user's repositories ---------------------------------------------------------------


def load_repo_tasks(path: str) -> Iterator[dict[str, Any]]:
    """Tasks from a JSONL of ``{"id", "repo", "tests", "prompt", optional "hidden"}``."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"repo tasks file {path!r} not found (env.options.dataset_path)")
    for n, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: not JSON ({e})") from None
        missing = [k for k in ("id", "repo", "tests", "prompt") if k not in row]
        if missing:
            raise ConfigError(
                f"{where}: missing {', '.join(missing)} (a line is "
                '{"id", "repo": folder or tarball, "tests": ["path::test_fn"], "prompt"})'
            )
        yield user_task(row, base=file.parent, where=where)


def user_task(row: dict[str, Any], base: Path, where: str) -> dict[str, Any]:
    """One user task: the repository read from its folder or tarball, tests split out."""
    repo = (base / str(row["repo"])).resolve()
    files = _read_repo(repo, where)
    hidden_paths = set(row.get("hidden") or [p for p in files if is_test_path(p)])
    tests = [str(t) for t in row["tests"]]
    for t in tests:
        file, sep, _ = t.partition("::")
        if not sep or file not in hidden_paths:
            raise ConfigError(
                f"{where}: test {t!r} must be 'path::function' with path one of the hidden "
                f"test files ({', '.join(sorted(hidden_paths)) or 'none found'})"
            )
    visible = {p: s for p, s in files.items() if p not in hidden_paths}
    packages = sorted(
        {
            p.split("/")[0].removesuffix(".py")
            for p in visible
            if p.endswith(".py") and not is_test_path(p)
        }
    )
    return {
        "id": str(row["id"]),
        "prompt": str(row["prompt"]),
        "files": visible,
        "hidden_tests": {p: files[p] for p in sorted(hidden_paths)},
        "tests": tests,
        "packages": packages,
        "reference_fix": row.get("reference_fix"),
        "source": "file",
    }


def _read_repo(repo: Path, where: str) -> dict[str, str]:
    files: dict[str, str] = {}
    if repo.is_dir():
        for p in sorted(repo.rglob("*")):
            rel = p.relative_to(repo).as_posix()
            if (
                p.is_file()
                and not p.is_symlink()
                and "__pycache__" not in rel
                and not rel.startswith(".git/")
            ):
                try:
                    files[rel] = p.read_text(encoding="utf-8")
                except UnicodeDecodeError:
                    continue  # binary files stay out of a text repository
    elif repo.is_file() and tarfile.is_tarfile(repo):
        with tarfile.open(repo) as tar:
            members = [m for m in tar.getmembers() if m.isfile()]
            prefix = _common_prefix([m.name for m in members])
            for m in members:
                rel = safe_path(m.name[len(prefix) :])
                data = tar.extractfile(m)
                if data is None or "__pycache__" in rel:
                    continue
                try:
                    files[rel] = io.TextIOWrapper(data, encoding="utf-8").read()
                except UnicodeDecodeError:
                    continue
    else:
        raise ConfigError(f"{where}: repo {str(repo)!r} is neither a folder nor a tarball")
    if not files:
        raise ConfigError(f"{where}: repo {str(repo)!r} holds no text files")
    return files


def _common_prefix(names: list[str]) -> str:
    """A single top folder of a tarball (``pkg-1.0/``) is stripped."""
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) == 1 and all("/" in n for n in names):
        return tops.pop() + "/"
    return ""
