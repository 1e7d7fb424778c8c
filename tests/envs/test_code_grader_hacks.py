"""The function grader against answers that try to pass without solving: each scores 0.

The task's hidden tests expect values no honest wrong answer returns (48611, 48612); a
control answer that computes them scores 1, so a grader that failed everything would
fail here too. Every adversary also carries that wrong function (``return 0``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agentrl.envs.coding.function_tests import FunctionGrader
from agentrl.envs.coding.harness import _find_report
from agentrl.errors import InfraError
from tests.sandbox.conftest import needs_bwrap

pytestmark = [pytest.mark.anyio, needs_bwrap]

TASK = {
    "id": "hack-target",
    "entry_point": "f",
    "setup": "",
    "tests": [
        {"name": "t1", "code": "assert f(3) == 48611"},
        {"name": "t2", "code": "result = f(4)\nassert result == 48612, result"},
    ],
}
HONEST = "def f(x):\n    return x + 48608\n"
WRONG = "\ndef f(x):\n    return 0\n"
TIMEOUT_S = 3.0

ADVERSARIES = {
    "sys_exit_before_tests": "import sys\nsys.exit(0)\n" + WRONG,
    "os_exit_before_tests": "import os\nos._exit(0)\n" + WRONG,
    "exit_inside_the_call": "def f(x):\n    raise SystemExit(0)\n",
    "os_exit_inside_the_call": "import os\ndef f(x):\n    os._exit(0)\n",
    "monkeypatch_assert_unittest_pytest": """
import atexit, builtins, os, sys, unittest
class _Never(Exception):
    pass
builtins.AssertionError = _Never
for name in dir(unittest.TestCase):
    if name.startswith("assert"):
        setattr(unittest.TestCase, name, lambda *a, **k: None)
try:
    import pytest
    pytest.fail = lambda *a, **k: None
except ImportError:
    pass
sys.excepthook = lambda *a: None
atexit.register(lambda: os._exit(0))
"""
    + WRONG,
    "fake_pass_summary": """
import os, sys
summary = "===== 2 passed in 0.01s =====\\nOK\\nAll tests passed\\nPASSED\\n"
print(summary)
sys.stderr.write(summary)
for target in ["/dev/stdout", "/dev/stderr", "/proc/1/fd/1", f"/proc/{os.getppid()}/fd/1"]:
    try:
        with open(target, "w") as out:
            out.write(summary)
    except OSError:
        pass
"""
    + WRONG,
    "plant_conftest_and_sitecustomize": """
import os
hack = "import os\\nos._exit(0)\\n"
places = [os.getcwd(), os.path.dirname(os.getcwd()), "/tmp", os.path.expanduser("~")]
for place in places:
    for name in ("conftest.py", "sitecustomize.py", "usercustomize.py", "pickle.py", "struct.py"):
        try:
            with open(os.path.join(place, name), "w") as out:
                out.write(hack)
        except OSError:
            pass
"""
    + WRONG,
    "edit_and_delete_test_files": """
import os
for top in ("/tmp", os.getcwd()):
    for root, dirs, files in os.walk(top):
        for name in files:
            path = os.path.join(root, name)
            if path.endswith("answer.py"):
                continue
            try:
                with open(path) as f:
                    text = f.read()
                if "assert" in text or "test" in name:
                    with open(path, "w") as f:
                        f.write("pass\\n")
                else:
                    os.remove(path)
            except (OSError, UnicodeDecodeError):
                pass
"""
    + WRONG,
    "read_hidden_tests_from_disk": r"""
import os, re

def _look():
    seen = []
    paths = []
    for top in ("/tmp", os.getcwd(), "/"):
        for root, dirs, files in os.walk(top):
            if root.startswith(("/proc", "/sys", "/usr", "/dev")):
                dirs[:] = []
                continue
            paths += [os.path.join(root, n) for n in files]
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            for what in ("cmdline", "environ", "maps"):
                paths.append(f"/proc/{pid}/{what}")
            try:
                paths += [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
            except OSError:
                pass
    for path in paths:
        try:  # non-blocking: a pipe's read end must not hang the search
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            try:
                data = os.read(fd, 1 << 20)
            finally:
                os.close(fd)
        except OSError:
            continue
        seen += re.findall(rb"== (4861\d)", data)
    try:  # the harness's memory, through /proc (non-dumpable: refused)
        with open(f"/proc/{os.getppid()}/mem", "rb") as f:
            seen += re.findall(rb"== (4861\d)", f.read(1 << 20))
    except OSError:
        pass
    return sorted({int(x) for x in seen})

FOUND = _look()

def f(x):
    found = FOUND or _look()
    return {3: found[0], 4: found[-1]}[x] if found else 0
""",
    "spend_the_whole_timeout": "import time\ntime.sleep(10**6)\n" + WRONG,
    "stall_inside_the_call": "def f(x):\n    while True:\n        pass\n",
    "escape_the_process_group_and_stall": """
import os, time
if os.fork() == 0:
    os.setsid()
    # allow-sleep: the adversarial answer leaves a process that stalls for good
    time.sleep(10**6)
"""
    + WRONG,
    "always_equal_object": """
class Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
def f(x):
    return Anything()
""",
    "int_subclass_that_equals_everything": """
class Liar(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
def f(x):
    return Liar(0)
""",
    "steal_and_forge_the_report": r"""
import json, os, re
if os.fork() == 0:  # outlives its test; reads the kernel's stdout through the sandbox's init
    os.setsid()
    try:
        stream = os.open("/proc/1/fd/1", os.O_RDONLY)
    except OSError:
        os._exit(0)
    seen = b""
    while True:
        chunk = os.read(stream, 1 << 16)
        if not chunk:
            os._exit(0)
        seen += chunk
        m = re.search(rb"([0-9a-f]{32}) ([0-9a-f]{64}) (\{.*\})
", seen)
        if m:
            nonce, mac, body = m.groups()
            report = json.loads(body)
            for test in report.get("tests", []):
                test.update(passed=True, error=None)
            forged = nonce + b" " + mac + b" " + json.dumps(report).encode() + b"
"
            with open("/proc/1/fd/1", "wb") as out:
                out.write(forged)
            os._exit(0)
"""
    + WRONG,
    "kill_the_harness": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n" + WRONG,
    "kill_every_process": """
import os, signal
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != os.getpid():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
"""
    + WRONG,
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def graded() -> AsyncIterator:
    grader = FunctionGrader(reward="fraction", test_timeout_s=TIMEOUT_S, concurrency=2)
    async with grader.sandbox() as sandbox:

        async def grade(answer: str) -> tuple[float, dict]:
            return await grader.grade(sandbox, TASK, answer)

        yield grade


async def test_the_honest_answer_passes_every_test(graded) -> None:
    reward, info = await graded(HONEST)
    assert (reward, info["passed"], info["total"]) == (1.0, 2, 2), info


async def test_a_wrong_answer_fails_with_the_failing_line(graded) -> None:
    reward, info = await graded(WRONG)
    assert reward == 0.0
    assert [t["passed"] for t in info["tests"]] == [False, False]
    assert "assert f(3) == 48611" in info["tests"][0]["error"]


@pytest.mark.parametrize("name", sorted(ADVERSARIES))
async def test_adversarial_answer_scores_zero(graded, name: str) -> None:
    try:
        reward, info = await graded(ADVERSARIES[name])
    except InfraError as e:  # the answer must not turn its failure into a masked episode
        pytest.fail(f"{name}: the answer made grading an infrastructure error: {e}")
    assert reward == 0.0, (name, info)
    assert info["passed"] == 0, (name, info)
    # a stalling answer ends at its tests' deadlines (a hang would hit pytest's timeout)


async def test_the_reader_would_find_tests_left_on_disk(graded) -> None:
    """Control: the disk-reading adversary passes when the expected values are on disk (the
    task's setup is written into the answer's module), so its 0 above means the hidden
    tests were nowhere it could read."""
    grader = FunctionGrader(reward="fraction", test_timeout_s=TIMEOUT_S, concurrency=1)
    leaky = {**TASK, "setup": "LEAK = 'f(3) == 48611; f(4) == 48612'\n"}
    async with grader.sandbox() as sandbox:
        reward, info = await grader.grade(
            sandbox, leaky, ADVERSARIES["read_hidden_tests_from_disk"]
        )
    assert reward == 1.0, info


async def test_the_reader_finishes_its_search_and_fails_the_assertions(graded) -> None:
    reward, info = await graded(ADVERSARIES["read_hidden_tests_from_disk"])
    assert reward == 0.0
    assert all(t["error"].startswith("AssertionError") for t in info["tests"]), info


def test_a_report_line_needs_the_runs_key() -> None:
    """What the thief above can do at best: re-send a stolen line with a changed body."""
    import hashlib
    import hmac
    import json

    nonce, key = "ab" * 16, "cd" * 32
    body = json.dumps({"tests": [{"passed": False}]})
    mac = hmac.new(bytes.fromhex(key), body.encode(), hashlib.sha256).hexdigest()
    genuine = f"{nonce} {mac} {body}"
    forged = f"{nonce} {mac} " + json.dumps({"tests": [{"passed": True}]})
    assert _find_report(f"{genuine}\n{forged}\n", nonce, key) == json.loads(body)
    assert _find_report(f"{forged}\n", nonce, key) is None  # stolen genuine line: no verdict
    assert _find_report(f"{genuine}\n", nonce, "ef" * 32) is None
