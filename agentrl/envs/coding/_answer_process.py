# ruff: noqa: F821  (CONFIG and _report come from harness.PRELUDE)
"""The answer-process protocol of the grading harnesses: runs inside a fresh sandbox.

Standard library only. Sent after ``harness.PRELUDE`` (this process is non-dumpable;
``_report`` writes the nonce-tagged report) and before one harness (``_function_harness.py``
or ``_repo_harness.py``), which supplies the test-running part. ``CONFIG`` holds at least
``tests``, ``test_timeout_s`` and ``max_message_bytes``.

The answer runs in child processes started here (``python -I``, own directory and session;
no conftest, sitecustomize or PYTHON* variables). A test's code runs HERE, in the harness;
a call sends plain arguments to the answer's process and gets back a plain value (an
allow-listed unpickler), so the answer never sees the assertions nor hands back an object
that claims equality. A test passes when its code returns normally before its deadline.
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

# The answer's process: framing over two pipes; each harness appends how a request is served.
WORKER_IO = r"""
import importlib, importlib.util, os, pickle, struct, sys, traceback


req, resp = int(sys.argv[1]), int(sys.argv[2])
_requests = os.fdopen(req, "rb")  # buffered: read(n) returns n bytes unless the pipe ends


def _read(n):
    data = _requests.read(n)
    if len(data) < n:
        raise EOFError
    return data


def _send(fd, obj):
    body = pickle.dumps(obj, protocol=4)
    data = struct.pack(">I", len(body)) + body
    while data:
        data = data[os.write(fd, data):]


def _short(e):
    return "".join(traceback.format_exception_only(type(e), e)).strip()[-400:]


def _serve(call):
    _send(resp, ("ready", None))
    while True:
        try:
            (size,) = struct.unpack(">I", _read(4))
            request = pickle.loads(_read(size))
        except EOFError:
            break
        try:
            value = call(request)
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
        "bool", "bytearray", "bytes", "complex", "dict", "float", "frozenset", "int",
        "list", "range", "set", "slice", "str", "tuple",
    },
    "collections": {"OrderedDict", "defaultdict", "Counter", "deque"},
    "fractions": {"Fraction"},
    "decimal": {"Decimal"},
    "datetime": {"date", "datetime", "time", "timedelta", "timezone"},
}  # fmt: skip


class AnswerFailed(BaseException):
    """The answer's process died, timed out or sent nothing usable. Not an Exception: a
    test's ``except Exception`` must not turn a dead answer into a pass."""


class _SpawnFailed(Exception):
    """The answer's process could not be started (before any answer code ran)."""


class _PlainUnpickler(pickle.Unpickler):
    def __init__(self, data, who):
        super().__init__(io.BytesIO(data))
        self.who = who

    def find_class(self, module, name):
        if name in _ALLOWED.get(module, ()):
            __import__(module)
            return getattr(sys.modules[module], name)
        raise pickle.UnpicklingError(
            f"{self.who} returned a {module}.{name}; only plain values cross to the tests"
        )


class _AnswerProcess:
    """One test's answer process, running ``worker`` in ``cwd``; ``request`` calls into it."""

    def __init__(self, worker, args, cwd, log_path, deadline, who):
        self.deadline, self.who, self.log_path = deadline, who, log_path
        self.proc = None
        req_r, self.req_w = os.pipe()
        self.resp_r, resp_w = os.pipe()
        with open(self.log_path, "wb") as log:
            try:
                self.proc = subprocess.Popen(
                    [sys.executable, "-I", "-c", worker, str(req_r), str(resp_w), *args],
                    pass_fds=(req_r, resp_w),
                    cwd=cwd,
                    env={"PATH": "/usr/bin:/bin", "HOME": cwd, "LANG": "C.UTF-8"},
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
                raise AnswerFailed(f"{who} failed to load: {rest[0]}")
            if tag != "ready":
                raise AnswerFailed(f"the answer's process sent {tag!r} instead of starting")
        except BaseException as e:
            e.answer_output = self.output_tail()
            self.close()  # the caller never gets this object to close
            raise

    def request(self, payload):
        """Send ``payload`` to the worker; its plain return value, or its error re-raised."""
        try:
            body = pickle.dumps(payload, protocol=4)
        except Exception as e:
            raise TypeError(f"a test argument cannot be sent to {self.who}: {e}") from None
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
                raise cls(f"{message} (raised by {self.who})")
            raise RuntimeError(f"{self.who} raised {message}")
        raise AnswerFailed(f"{self.who} returned a value that cannot be sent: {rest[0]}")

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
                f"{self.who} sent {size} bytes (limit {CONFIG['max_message_bytes']})"
            )
        try:
            msg = _PlainUnpickler(self._read(size), self.who).load()
        except AnswerFailed:
            raise
        except Exception as e:
            raise AnswerFailed(f"{self.who} sent something unreadable: {e}") from None
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


def _failing_line(e, filename, source):
    """`` at: <the test's line>``: which assertion failed (an AssertionError says nothing)."""
    line, tb = None, e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    lines = source.splitlines()
    if line is None or not 0 < line <= len(lines):
        return ""
    return " at: " + lines[line - 1].strip()[:200]


def _on_alarm(signum, frame):
    raise AnswerFailed("the test ran out of time")


def _run_test(index, result, open_answer, run, failing_line):
    """``run(answer)`` under the test's deadline; ``result`` gets the verdict and the output.

    ``open_answer(deadline)`` starts the answer's process; ``failing_line(e)`` locates an error.
    """
    start = time.monotonic()
    answer = None
    result.update(passed=False, error=None)
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, CONFIG["test_timeout_s"] + 0.5)  # test code's own loops
    try:
        answer = open_answer(start + CONFIG["test_timeout_s"])
        run(answer)
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
        result["error"] = (f"{type(e).__name__}: {e}" + failing_line(e))[:500]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        if answer is not None:
            if not result["passed"]:
                result["answer_output"] = answer.output_tail()
            answer.close()
    result["wall_s"] = round(time.monotonic() - start, 3)
    return result


def _grade(prepare, run_one, key):
    """Report every test's result: ``prepare(root)`` (compile, write files; no answer code
    runs yet) gives ``run_one(index, test, root, prepared)`` its input; ``key`` names a test."""
    # test code's prints and warnings stay out of the report stream
    sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
    try:
        root = tempfile.mkdtemp(prefix="grade-")
        prepared = prepare(root)
    except BaseException as e:  # before any answer code ran: the grader's own failure
        _report({"harness_error": f"{type(e).__name__}: {e}"})
        return
    results = []
    for index, test in enumerate(CONFIG["tests"]):
        try:
            results.append(run_one(index, test, root, prepared))
        except _SpawnFailed as e:
            _report({"harness_error": str(e)})
            return
        except BaseException as e:  # e.g. /tmp filled by an earlier test's answer
            results.append({key: test[key], "passed": False, "error": f"grading: {e!r}"})
    shutil.rmtree(root, ignore_errors=True)
    _report({"tests": results})
