"""The repo grader against diffs that try to pass without fixing the bug: each scores 0.

The hidden test expects values no wrong code returns (48611, 48612); the honest diff scores
1, so a grader that failed everything would fail here too. Every adversary keeps the bug
(``return 0``) and adds its trick to the repository's module (or to test files).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agentrl.envs.coding.repo_diff import make_diff
from agentrl.envs.coding.repo_tests import RepoGrader
from tests.sandbox.conftest import needs_bwrap

pytestmark = [pytest.mark.anyio, needs_bwrap]

BUGGY = "def f(x):\n    return 0\n"
TASK = {
    "id": "hack-target",
    "prompt": "fix f",
    "files": {"calc/__init__.py": "", "calc/core.py": BUGGY},
    "hidden_tests": {
        "tests/test_core.py": "from calc.core import f\n\n\ndef test_f():\n"
        "    assert f(3) == 48611\n    assert f(4) == 48612\n"
    },
    "tests": ["tests/test_core.py::test_f"],
    "packages": ["calc"],
}
TIMEOUT_S = 3.0


def module_diff(prefix: str, extra: dict[str, str] | None = None, body: str = BUGGY) -> str:
    """A diff that puts ``prefix`` before the function (and writes ``extra`` files)."""
    files = {**TASK["files"], "calc/core.py": prefix + body, **(extra or {})}
    return make_diff(TASK["files"], files)


READER = (
    "import os, re\n"
    "def _look():\n"
    "    seen = []\n"
    "    for top in ('/tmp', '/'):\n"
    "        for root, dirs, files in os.walk(top):\n"
    "            if root.startswith(('/proc', '/sys', '/usr', '/dev')):\n"
    "                dirs[:] = []\n"
    "                continue\n"
    "            for n in files:\n"
    "                try:\n"
    "                    seen += re.findall(r'== (4861\\d)', open(os.path.join(root, n)).read())\n"
    "                except (OSError, UnicodeDecodeError):\n"
    "                    pass\n"
    "    try:\n"
    "        mem = open(f'/proc/{os.getppid()}/mem', 'rb').read(1 << 20)\n"
    "        seen += [x.decode() for x in re.findall(rb'== (4861\\d)', mem)]\n"
    "    except OSError:\n"
    "        pass\n"
    "    return sorted({int(x) for x in seen})\n"
)
CHEAT = "FOUND = _look()\ndef f(x):\n    return {3: FOUND[0], 4: FOUND[-1]}[x] if FOUND else 0\n"


ADVERSARIES = {
    "edit_and_delete_test_files": make_diff(
        {**TASK["files"], **TASK["hidden_tests"]},
        {**TASK["files"], "tests/test_core.py": "def test_f():\n    pass\n"},
    ),
    "sys_exit_before_tests": module_diff("import sys\nsys.exit(0)\n"),
    "os_exit_before_tests": module_diff("import os\nos._exit(0)\n"),
    "patched_test_runner": module_diff(
        "import builtins, sys, unittest\n"
        "builtins.AssertionError = type('Never', (Exception,), {})\n"
        "for n in dir(unittest.TestCase):\n"
        "    if n.startswith('assert'):\n"
        "        setattr(unittest.TestCase, n, lambda *a, **k: None)\n"
        "sys.modules['pytest'] = type(sys)('pytest')\n"
    ),
    "fake_pass_output": module_diff(
        "import os, sys\n"
        "s = '===== 1 passed in 0.01s =====\\nOK\\nPASSED\\n'\n"
        "print(s); sys.stderr.write(s)\n"
        "for t in ('/dev/stdout', '/proc/1/fd/1', f'/proc/{os.getppid()}/fd/1'):\n"
        "    try:\n"
        "        open(t, 'w').write(s)\n"
        "    except OSError:\n"
        "        pass\n"
    ),
    "conftest_and_sitecustomize": module_diff(
        "",
        {
            "conftest.py": "import os\nos._exit(0)\n",
            "sitecustomize.py": "import os\nos._exit(0)\n",
            "calc/usercustomize.py": "import os\nos._exit(0)\n",
            "calc/hack.pth": "import os; os._exit(0)\n",
        },
    ),
    "read_hidden_tests_from_disk": module_diff(READER, body=CHEAT),
    "stalling": module_diff("import time\ntime.sleep(10**6)\n"),
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def graded() -> AsyncIterator:
    grader = RepoGrader(reward="fraction", test_timeout_s=TIMEOUT_S, concurrency=2)
    async with grader.sandbox() as sandbox:

        async def grade(diff: str) -> tuple[float, dict]:
            return await grader.grade(sandbox, TASK, diff)

        yield grade


async def test_the_honest_fix_scores_1(graded) -> None:
    fixed = make_diff(
        TASK["files"], {**TASK["files"], "calc/core.py": "def f(x):\n    return x + 48608\n"}
    )
    reward, info = await graded(fixed)
    assert reward == 1.0, info
    assert info["changed"] == ["calc/core.py"]


@pytest.mark.parametrize("name", sorted(ADVERSARIES))
async def test_adversarial_diff_scores_0(graded, name: str) -> None:
    reward, info = await graded(ADVERSARIES[name])
    assert reward == 0.0, (name, info)
    if name in ("edit_and_delete_test_files", "conftest_and_sitecustomize"):
        assert info["discarded"], info  # the grader says what it dropped


async def test_the_reader_would_pass_if_the_tests_were_on_disk(graded) -> None:
    """Control: the reader above works; with the values on disk it scores 1."""
    plant = "open('/tmp/planted.txt', 'w').write('== 48611 == 48612')\n"
    reward, info = await graded(module_diff(READER + plant, body=CHEAT))
    assert reward == 1.0, info
