# ruff: noqa: F821  (NONCE, CONFIG and _report come from harness.PRELUDE)
"""The repository-test harness: runs inside a fresh sandbox (standard library only).

Sent after ``harness.PRELUDE`` (this process is non-dumpable; ``_report`` writes the
nonce-tagged report). ``CONFIG``:

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
import io
import os
import pickle
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

WORKER = r"""
import importlib, os, pickle, struct, sys, traceback
sys.path.insert(0, os.getcwd())


def _read(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _send(fd, obj):
    body = pickle.dumps(obj, protocol=4)
    data = struct.pack(">I", len(body)) + body
    while data:
        data = data[os.write(fd, data):]


def _short(e):
    return "".join(traceback.format_exception_only(type(e), e)).strip()[-400:]


req, resp = int(sys.argv[1]), int(sys.argv[2])
_send(resp, ("ready", None))
while True:
    try:
        (size,) = struct.unpack(">I", _read(req, 4))
        module, attr, args, kwargs = pickle.loads(_read(req, size))
    except EOFError:
        break
    try:
        obj = importlib.import_module(module)
        for part in attr.split(".") if attr else ():
            try:
                obj = getattr(obj, part)
            except AttributeError:  # a submodule not imported yet (import pkg; pkg.mod.f)
                if not isinstance(obj, type(sys)):
                    raise
                obj = importlib.import_module(obj.__name__ + "." + part)
        value = obj(*args, **kwargs) if args is not None else obj
    except BaseException as e:
        name = type(e).__name__ if type(e).__module__ == "builtins" else ""
        _send(resp, ("raise", name, _short(e)))
        continue
    try:
        _send(resp, ("ok", value))
    except BaseException as e:
        _send(resp, ("unsendable", type(value).__name__ + ": " + _short(e)))
"""

_ALLOWED = {
    "builtins": {
        "bool", "bytearray", "bytes", "complex", "dict", "float", "frozenset", "int",
        "list", "range", "set", "slice", "str", "tuple",
    },
    "collections": {"OrderedDict", "defaultdict", "Counter", "deque"},
    "fractions": {"Fraction"},
    "decimal": {"Decimal"},
    "datetime": {"date", "datetime", "time", "timedelta", "timezone"},
}  # fmt: skip


class AnswerFailed(BaseException):
    """The answer's process died, timed out or broke the protocol (a test's ``except
    Exception`` must not turn that into a pass)."""


class _SpawnFailed(Exception):
    """The answer's process could not start (before any answer code ran)."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if name in _ALLOWED.get(module, ()):
            __import__(module)
            return getattr(sys.modules[module], name)
        raise pickle.UnpicklingError(
            f"the repository returned a {module}.{name}; only plain values cross to the tests"
        )


class _Answer:
    """One test's process holding the repository's code."""

    def __init__(self, repo, deadline):
        self.deadline = deadline
        self.proc = None
        req_r, self.req_w = os.pipe()
        self.resp_r, resp_w = os.pipe()
        self.log_path = os.path.join(os.path.dirname(repo), "output.log")
        with open(self.log_path, "wb") as log:
            try:
                self.proc = subprocess.Popen(
                    [sys.executable, "-I", "-c", WORKER, str(req_r), str(resp_w)],
                    pass_fds=(req_r, resp_w),
                    cwd=repo,
                    env={"PATH": "/usr/bin:/bin", "HOME": repo, "LANG": "C.UTF-8"},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as e:
                raise _SpawnFailed(f"cannot start the answer's process: {e}") from None
        os.close(req_r)
        os.close(resp_w)
        tag, *_ = self.recv()
        if tag != "ready":
            raise AnswerFailed(f"the answer's process sent {tag!r} instead of starting")

    def request(self, module, attr, args, kwargs):
        try:
            body = pickle.dumps((module, attr, args, kwargs), protocol=4)
        except Exception as e:
            raise TypeError(f"a test argument cannot be sent to the repository: {e}") from None
        self._send(struct.pack(">I", len(body)) + body)
        tag, *rest = self.recv()
        if tag == "ok":
            return rest[0]
        if tag == "raise":
            name, message = rest
            cls = getattr(builtins, name, None) if name else None
            if isinstance(cls, type) and issubclass(cls, Exception):
                if message.startswith(name + ": "):
                    message = message[len(name) + 2 :]
                raise cls(f"{message} (raised by the repository)")
            raise RuntimeError(f"the repository raised {message}")
        raise AnswerFailed(f"the repository returned a value that cannot be sent: {rest[0]}")

    def _remaining(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise AnswerFailed("the test ran out of time")
        return left

    def _send(self, data):
        while data:
            _, ready, _ = select.select([], [self.req_w], [], self._remaining())
            if ready:
                try:
                    data = data[os.write(self.req_w, data) :]
                except OSError as e:
                    raise AnswerFailed(f"the answer's process stopped reading: {e}") from None

    def _read(self, n):
        chunks = []
        while n:
            ready, _, _ = select.select([self.resp_r], [], [], self._remaining())
            if not ready:
                continue
            chunk = os.read(self.resp_r, min(n, 1 << 20))
            if not chunk:
                raise AnswerFailed("the answer's process exited")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def recv(self):
        (size,) = struct.unpack(">I", self._read(4))
        if size > CONFIG["max_message_bytes"]:
            raise AnswerFailed(f"the repository sent {size} bytes")
        try:
            msg = _PlainUnpickler(io.BytesIO(self._read(size))).load()
        except AnswerFailed:
            raise
        except Exception as e:
            raise AnswerFailed(f"the repository sent something unreadable: {e}") from None
        if not isinstance(msg, tuple) or not msg or not isinstance(msg[0], str):
            raise AnswerFailed("the answer's process broke the call protocol")
        return msg

    def close(self):
        for fd in (self.req_w, self.resp_r):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def output_tail(self):
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 300))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""


class _Remote:
    """``module.attr`` of the repository, seen from a test: call it, or go deeper."""

    def __init__(self, answer, module, attr):
        self._answer, self._module, self._attr = answer, module, attr

    def __call__(self, *args, **kwargs):
        return self._answer.request(self._module, self._attr, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Remote(self._answer, self._module, f"{self._attr}.{name}".lstrip("."))

    def value(self):
        """The attribute's value itself (a constant), as plain data."""
        return self._answer.request(self._module, self._attr, None, None)


def _importer(answer):
    real_import = builtins.__import__

    def _import(name, globals=None, locals=None, fromlist=(), level=0):
        top = name.split(".")[0]
        if level or top not in CONFIG["packages"]:
            return real_import(name, globals, locals, fromlist, level)
        return _Remote(answer, name if fromlist else top, "")

    return _import


def _failing_line(e, test):
    """`` at: <the test's line>``: which assertion failed (an AssertionError says nothing)."""
    line, tb = None, e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == test["file"]:
            line = tb.tb_lineno
        tb = tb.tb_next
    lines = CONFIG["test_sources"][test["file"]].splitlines()
    if line is None or not 0 < line <= len(lines):
        return ""
    return " at: " + lines[line - 1].strip()[:200]


def _on_alarm(signum, frame):
    raise AnswerFailed("the test ran out of time")


def _run_test(index, test, root, repo):
    start = time.monotonic()
    result = {"id": test["id"], "passed": False, "error": None}
    answer = None
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, CONFIG["test_timeout_s"] + 0.5)
    try:
        answer = _Answer(repo, start + CONFIG["test_timeout_s"])
        test_builtins = dict(vars(builtins))
        test_builtins["__import__"] = _importer(answer)
        namespace = {"__name__": "__test__", "__builtins__": test_builtins}
        source = CONFIG["test_sources"][test["file"]]
        exec(compile(source, test["file"], "exec"), namespace)
        fn = namespace.get(test["name"])
        if not callable(fn):
            raise AnswerFailed(f"no test function {test['name']!r} in {test['file']}")
        fn()
        result["passed"] = True
    except AnswerFailed as e:
        result["error"] = str(e)[:500]
    except _SpawnFailed:
        if index == 0:
            raise
        result["error"] = "the answer's process could not start (earlier tests' processes?)"
    except Exception as e:
        result["error"] = (f"{type(e).__name__}: {e}" + _failing_line(e, test))[:500]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        if answer is not None:
            if not result["passed"]:
                result["output"] = answer.output_tail()
            answer.close()
    result["wall_s"] = round(time.monotonic() - start, 3)
    return result


def _write_repo(root):
    repo = os.path.join(root, "repo")
    for path, text in CONFIG["files"].items():
        full = os.path.join(repo, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(text)
    os.makedirs(repo, exist_ok=True)
    return repo


def _main():
    sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
    try:
        root = tempfile.mkdtemp(prefix="grade-")
        for file, source in CONFIG["test_sources"].items():
            compile(source, file, "exec")
        repo = _write_repo(root)
    except BaseException as e:  # before any answer code ran: the grader's own failure
        _report({"harness_error": f"{type(e).__name__}: {e}"})
        return
    results = []
    for index, test in enumerate(CONFIG["tests"]):
        try:
            results.append(_run_test(index, test, root, repo))
        except _SpawnFailed as e:
            _report({"harness_error": str(e)})
            return
        except BaseException as e:
            results.append({"id": test["id"], "passed": False, "error": f"grading: {e!r}"})
    shutil.rmtree(root, ignore_errors=True)
    _report({"tests": results})


_main()
