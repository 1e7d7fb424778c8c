"""The insecure rlimits-only backend: refused by default, loud when allowed, still bounded."""

from __future__ import annotations

import os
import time
import warnings

import pytest

from agentrl.errors import SandboxUnavailableError
from agentrl.sandbox import create_sandbox

pytestmark = pytest.mark.anyio


def test_refused_unless_allowed() -> None:
    with pytest.raises(SandboxUnavailableError, match="allow_insecure=True"):
        create_sandbox("subprocess")


def test_warning_names_what_is_not_isolated() -> None:
    with pytest.warns(RuntimeWarning, match="NOT isolated") as record:
        create_sandbox("subprocess", allow_insecure=True)
    text = str(record[0].message)
    assert "file" in text and "network" in text and "processes" in text


def _insecure(**limits):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return create_sandbox("subprocess", allow_insecure=True, pool_size=0, **limits)


async def test_runs_with_state_limits_and_cleanup(marker: str) -> None:
    sb = _insecure(label=marker, memory_mb=256)
    try:
        async with sb.session() as s:
            assert (await s.run("x = 20")).ok
            r = await s.run("import os\nprint(x * 2, os.getuid() != 0)")
            assert (r.status, r.stdout) == ("ok", "40 True\n")
            code = (
                "import subprocess, time\n"
                f"subprocess.Popen(['/usr/bin/python3', '-c', 'import time; time.sleep(99)', '{marker}'])\n"
                "time.sleep(100)"
            )
            t0 = time.perf_counter()  # allow-clock: the sandbox's wall limit is a time limit
            r = await s.run(code, timeout=1)
            # allow-clock: the same limit; the slack is room for a loaded machine to kill
            assert r.status == "timeout" and time.perf_counter() - t0 < 1 + 10
            r = await s.run("b = bytearray(2 * 1024**3)")
            assert r.status == "memory" and r.state_lost
            r = await s.run("import os\nprint(os.getcwd())")
            workdir = r.stdout.strip()
            assert os.path.isdir(workdir)
    finally:
        await sb.close()
    assert not os.path.exists(workdir)  # its private working directory is removed
