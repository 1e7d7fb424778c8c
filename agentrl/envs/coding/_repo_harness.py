# ruff: noqa: F821  (CONFIG, _report and the protocol come from harness.PRELUDE and _answer_process.py)
"""The repository-test harness: runs inside a fresh sandbox (standard library only).

Sent after ``harness.PRELUDE`` (non-dumpable; ``_report``) and ``_answer_process.py``
(the answer's processes and their protocol). ``CONFIG``:

    files          {path: text}: the ORIGINAL repository with the answer's non-test diff
    tests          [{"id": "tests/test_x.py::test_y", "file": ..., "name": ...}]: must pass
    test_sources   {file: source}: the hidden test files (never written to disk here)
    packages       top-level module names of the repository (imported in the answer's process)
    test_timeout_s, max_message_bytes

The repository goes to a fresh directory; each test gets a fresh answer process there
(``python -I``: no conftest, sitecustomize or PYTHON* variables). The test's own code runs
HERE, in the harness: ``import pkg.mod`` / ``from pkg.mod import f`` inside the test give
proxies, and a call sends plain arguments to the answer's process and gets back a plain
value (an allow-listed unpickler), so the repository's code never sees the test, cannot
patch ``assert``, unittest or the runner, and cannot claim a pass. A test passes when its
function returns before the deadline.
"""

import builtins
import os

WORKER = (
    WORKER_IO
    + r"""
sys.path.insert(0, os.getcwd())


def _call(request):
    module, attr, args, kwargs = request
    obj = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        try:
            obj = getattr(obj, part)
        except AttributeError:  # a submodule not imported yet (import pkg; pkg.mod.f)
            if not isinstance(obj, type(sys)):
                raise
            obj = importlib.import_module(obj.__name__ + "." + part)
    return obj(*args, **kwargs) if args is not None else obj


_serve(_call)
"""
)


def _open_answer(repo, deadline):
    """One test's process holding the repository's code."""
    log_path = os.path.join(os.path.dirname(repo), "output.log")
    return _AnswerProcess(WORKER, [], repo, log_path, deadline, "the repository")


class _Remote:
    """``module.attr`` of the repository, seen from a test: call it, or go deeper."""

    def __init__(self, answer, module, attr):
        self._answer, self._module, self._attr = answer, module, attr

    def __call__(self, *args, **kwargs):
        return self._answer.request((self._module, self._attr, args, kwargs))

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Remote(self._answer, self._module, f"{self._attr}.{name}".lstrip("."))

    def value(self):
        """The attribute's value itself (a constant), as plain data."""
        return self._answer.request((self._module, self._attr, None, None))


def _importer(answer):
    real_import = builtins.__import__

    def _import(name, globals=None, locals=None, fromlist=(), level=0):
        top = name.split(".")[0]
        if level or top not in CONFIG["packages"]:
            return real_import(name, globals, locals, fromlist, level)
        return _Remote(answer, name if fromlist else top, "")

    return _import


def _run_one(index, test, root, repo):
    source = CONFIG["test_sources"][test["file"]]

    def run(answer):
        test_builtins = dict(vars(builtins))
        test_builtins["__import__"] = _importer(answer)
        namespace = {"__name__": "__test__", "__builtins__": test_builtins}
        exec(compile(source, test["file"], "exec"), namespace)
        fn = namespace.get(test["name"])
        if not callable(fn):
            raise AnswerFailed(f"no test function {test['name']!r} in {test['file']}")
        fn()

    return _run_test(
        index,
        {"id": test["id"]},
        lambda deadline: _open_answer(repo, deadline),
        run,
        lambda e: _failing_line(e, test["file"], source),
    )


def _prepare(root):
    for file, source in CONFIG["test_sources"].items():
        compile(source, file, "exec")
    return _write_repo(root)


def _write_repo(root):
    repo = os.path.join(root, "repo")
    for path, text in CONFIG["files"].items():
        full = os.path.join(repo, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(text)
    os.makedirs(repo, exist_ok=True)
    return repo


_grade(_prepare, _run_one, "id")
