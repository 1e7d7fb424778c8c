# ruff: noqa: F821  (CONFIG, _report and the protocol come from harness.PRELUDE and _answer_process.py)
"""The function-test harness: runs inside a fresh sandbox (standard library only).

Sent after ``harness.PRELUDE`` (non-dumpable; ``_report``) and ``_answer_process.py``
(the answer's processes and their protocol). ``CONFIG``:

    answer       the answer's module source (written to disk for the answer's process)
    entry_point  the function the tests call
    setup        trusted code run before each test (imports, helpers the tests use)
    tests        [{"name": str, "code": str}]: each runs in a fresh namespace
    test_timeout_s, max_message_bytes

Each test gets a fresh answer process (``python -I``, its own directory and session). The
test's code runs HERE, in the harness, with the entry point bound to a proxy: a call sends
the arguments to the answer's process and gets back its return value as plain data
(numbers, strings, containers and a few standard-library value types, unpickled with an
allow-list), so the answer can neither see the assertions nor hand back an object that
claims equality. A test passes when its code returns normally before its deadline.
"""

import builtins
import os
import shutil
import tempfile

WORKER = (
    WORKER_IO
    + r"""
try:
    spec = importlib.util.spec_from_file_location("answer", os.path.abspath("answer.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["answer"] = mod
    spec.loader.exec_module(mod)
    fn = getattr(mod, sys.argv[3])
except BaseException as e:
    _send(resp, ("import_error", _short(e)))
    raise SystemExit(0)
_serve(lambda request: fn(*request[0], **request[1]))
"""
)


class _Answer(_AnswerProcess):
    """One test's answer process, called like the entry point."""

    def __init__(self, workdir, deadline):
        super().__init__(
            WORKER,
            [CONFIG["entry_point"]],
            workdir,
            os.path.join(workdir, "output.log"),
            deadline,
            "the answer",
        )

    def __call__(self, *args, **kwargs):
        return self.request((args, kwargs))


def _test_file(test):
    return f"<test {test['name']}>"


def _run_one(index, test, root, _prepared):
    workdir = tempfile.mkdtemp(prefix=f"t{index}-", dir=root)
    with open(os.path.join(workdir, "answer.py"), "w", encoding="utf-8") as f:
        f.write(CONFIG["answer"])

    def run(answer):
        namespace = {"__name__": "__test__", "__builtins__": builtins}
        exec(compile(CONFIG["setup"], "<setup>", "exec"), namespace)
        namespace[CONFIG["entry_point"]] = answer
        exec(compile(test["code"], _test_file(test), "exec"), namespace)

    try:
        return _run_test(
            index,
            {"name": test["name"]},
            lambda deadline: _Answer(workdir, deadline),
            run,
            lambda e: _failing_line(e, _test_file(test), test["code"]),
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _prepare(root):
    compile(CONFIG["setup"], "<setup>", "exec")
    for test in CONFIG["tests"]:
        compile(test["code"], _test_file(test), "exec")


_grade(_prepare, _run_one, "name")
