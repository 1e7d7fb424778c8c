# ruff: noqa: F821  (NONCE, CONFIG and _report come from harness.PRELUDE)
"""The function-test harness: runs inside a fresh sandbox (standard library only).

Its source is sent as the code of one sandbox run after ``harness.PRELUDE``, which made
this process non-dumpable and defined ``_report``. ``CONFIG``:

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
import importlib.util, os, pickle, struct, sys, traceback


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
    text = "".join(traceback.format_exception_only(type(e), e)).strip()
    return text[-400:]


req, resp, entry = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
try:
    spec = importlib.util.spec_from_file_location("answer", os.path.abspath("answer.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["answer"] = mod
    spec.loader.exec_module(mod)
    fn = getattr(mod, entry)
except BaseException as e:
    _send(resp, ("import_error", _short(e)))
    raise SystemExit(0)
_send(resp, ("ready", None))
while True:
    try:
        (size,) = struct.unpack(">I", _read(req, 4))
        args, kwargs = pickle.loads(_read(req, size))
    except EOFError:
        break
    try:
        value = fn(*args, **kwargs)
    except BaseException as e:
        name = type(e).__name__ if type(e).__module__ == "builtins" else ""
        _send(resp, ("raise", name, _short(e)))
        continue
    try:
        _send(resp, ("ok", value))
    except BaseException as e:
        _send(resp, ("unsendable", type(value).__name__ + ": " + _short(e)))
"""

# Value types that may cross from the answer to the tests: the real classes, imported here.
_ALLOWED = {
    "builtins": {
        "bool",
        "bytearray",
        "bytes",
        "complex",
        "dict",
        "float",
        "frozenset",
        "int",
        "list",
        "range",
        "set",
        "slice",
        "str",
        "tuple",
    },
    "collections": {"OrderedDict", "defaultdict", "Counter", "deque"},
    "fractions": {"Fraction"},
    "decimal": {"Decimal"},
    "datetime": {"date", "datetime", "time", "timedelta", "timezone"},
}


class AnswerFailed(BaseException):
    """The answer's process died, timed out or sent nothing usable. Not an Exception: a
    test's ``except Exception`` must not turn a dead answer into a pass."""


class _SpawnFailed(Exception):
    """The answer's process could not be started (before any answer code ran)."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if name in _ALLOWED.get(module, ()):
            __import__(module)
            return getattr(sys.modules[module], name)
        raise pickle.UnpicklingError(
            f"the answer returned a {module}.{name}; only plain values cross to the tests"
        )


class _Answer:
    """One test's answer process, called like the entry point."""

    def __init__(self, workdir, deadline):
        self.deadline = deadline
        self.proc = None
        req_r, self.req_w = os.pipe()
        self.resp_r, resp_w = os.pipe()
        self.log_path = os.path.join(workdir, "output.log")
        with open(self.log_path, "wb") as log:
            try:
                self.proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-I",
                        "-c",
                        WORKER,
                        str(req_r),
                        str(resp_w),
                        CONFIG["entry_point"],
                    ],
                    pass_fds=(req_r, resp_w),
                    cwd=workdir,
                    env={"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8"},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as e:
                for fd in (req_r, resp_w, self.req_w, self.resp_r):
                    os.close(fd)
                raise _SpawnFailed(f"cannot start the answer's process: {e}") from None
        os.close(req_r)
        os.close(resp_w)
        try:
            tag, *rest = self._recv()
            if tag == "import_error":
                raise AnswerFailed(f"the answer failed to load: {rest[0]}")
            if tag != "ready":
                raise AnswerFailed(f"the answer's process sent {tag!r} instead of starting")
        except BaseException as e:
            e.answer_output = self.output_tail()
            self.close()  # the caller never gets this object to close
            raise

    def __call__(self, *args, **kwargs):
        try:
            body = pickle.dumps((args, kwargs), protocol=4)
        except Exception as e:
            raise TypeError(f"a test argument cannot be sent to the answer: {e}") from None
        self._send(struct.pack(">I", len(body)) + body)
        tag, *rest = self._recv()
        if tag == "ok":
            return rest[0]
        if tag == "raise":
            name, message = rest
            cls = getattr(builtins, name, None) if name else None
            if isinstance(cls, type) and issubclass(cls, Exception):
                if message.startswith(name + ": "):
                    message = message[len(name) + 2 :]
                raise cls(f"{message} (raised by the answer)")
            raise RuntimeError(f"the answer raised {message}")
        raise AnswerFailed(f"the answer returned a value that cannot be sent: {rest[0]}")

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
                raise AnswerFailed("the answer's process exited" + self._exit_note())
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def _recv(self):
        (size,) = struct.unpack(">I", self._read(4))
        if size > CONFIG["max_message_bytes"]:
            raise AnswerFailed(
                f"the answer sent {size} bytes (limit {CONFIG['max_message_bytes']})"
            )
        try:
            msg = _PlainUnpickler(io.BytesIO(self._read(size))).load()
        except AnswerFailed:
            raise
        except Exception as e:
            raise AnswerFailed(f"the answer sent something unreadable: {e}") from None
        if not isinstance(msg, tuple) or not msg or not isinstance(msg[0], str):
            raise AnswerFailed("the answer's process broke the call protocol")
        return msg

    def _exit_note(self):
        try:
            rc = self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            return ""
        return f" (exit status {rc})"

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


def _failing_line(e, test):
    """`` at: <the test's line>``: which assertion failed (an AssertionError says nothing)."""
    line, tb = None, e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith("<test "):
            line = tb.tb_lineno
        tb = tb.tb_next
    lines = test["code"].splitlines()
    if line is None or not 0 < line <= len(lines):
        return ""
    return " at: " + lines[line - 1].strip()[:200]


def _on_alarm(signum, frame):
    raise AnswerFailed("the test ran out of time")


def _run_test(index, test, root):
    workdir = tempfile.mkdtemp(prefix=f"t{index}-", dir=root)
    with open(os.path.join(workdir, "answer.py"), "w", encoding="utf-8") as f:
        f.write(CONFIG["answer"])
    start = time.monotonic()
    deadline = start + CONFIG["test_timeout_s"]
    answer = None
    result = {"name": test["name"], "passed": False, "error": None}
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, CONFIG["test_timeout_s"] + 0.5)  # test code's own loops
    try:
        answer = _Answer(workdir, deadline)
        namespace = {"__name__": "__test__", "__builtins__": builtins}
        exec(compile(CONFIG["setup"], "<setup>", "exec"), namespace)
        namespace[CONFIG["entry_point"]] = answer
        exec(compile(test["code"], f"<test {test['name']}>", "exec"), namespace)
        result["passed"] = True
    except AnswerFailed as e:
        result["error"] = str(e)[:500]
        if getattr(e, "answer_output", None) is not None:
            result["answer_output"] = e.answer_output
    except _SpawnFailed:
        if index == 0:  # nothing of the answer ran yet: the sandbox cannot grade
            raise
        result["error"] = "the answer's process could not start (earlier tests' processes?)"
    except Exception as e:
        result["error"] = (f"{type(e).__name__}: {e}" + _failing_line(e, test))[:500]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        if answer is not None:
            if not result["passed"]:
                result["answer_output"] = answer.output_tail()
            answer.close()
        shutil.rmtree(workdir, ignore_errors=True)
    result["wall_s"] = round(time.monotonic() - start, 3)
    return result


def _main():
    # test code's prints and warnings stay out of the report stream
    sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
    try:
        root = tempfile.mkdtemp(prefix="grade-")
        compile(CONFIG["setup"], "<setup>", "exec")
        for test in CONFIG["tests"]:
            compile(test["code"], f"<test {test['name']}>", "exec")
    except BaseException as e:  # before any answer code ran: the grader's own failure
        _report({"harness_error": f"{type(e).__name__}: {e}"})
        return
    results = []
    for index, test in enumerate(CONFIG["tests"]):
        try:
            results.append(_run_test(index, test, root))
        except _SpawnFailed as e:
            _report({"harness_error": str(e)})
            return
        except BaseException as e:  # e.g. /tmp filled by an earlier test's answer
            results.append({"name": test["name"], "passed": False, "error": f"grading: {e!r}"})
    _report({"tests": results})


_main()
