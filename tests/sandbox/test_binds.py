"""rw_binds: a host folder bound read-write (the repo environment's workspace), and only it."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.errors import ConfigError
from agentrl.sandbox import create_sandbox
from tests.sandbox.conftest import needs_bwrap

pytestmark = [pytest.mark.anyio, needs_bwrap]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A folder the sandbox's uid can reach (pytest's tmp_path sits under a 0700 folder)."""
    path = Path(tempfile.mkdtemp(prefix="agentrl-bind-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_a_bound_folder_is_writable_inside_and_nothing_else_is(reachable: Path) -> None:
    tmp_path = reachable
    ws = tmp_path / "ws"
    ws.mkdir()
    if os.geteuid() == 0:
        os.chown(ws, 65534, 65534)
    (tmp_path / "outside.txt").write_text("host")
    code = (
        "open('/repo/new.txt', 'w').write('from inside')\n"
        f"print(os.path.exists({str(tmp_path / 'outside.txt')!r}))\n"
    )
    async with create_sandbox(backend="bwrap", rw_binds=(f"{ws}:/repo",)) as sb:
        res = await sb.run("import os\n" + code, timeout=10)
    assert res.status == "ok", res.stderr
    assert res.stdout.strip() == "False"  # the folder's parent stays invisible
    assert (ws / "new.txt").read_text() == "from inside"


def test_rw_binds_is_a_validated_limit() -> None:
    with pytest.raises(ConfigError, match="rw_binds"):
        create_sandbox(backend="bwrap", rw_binds=[3.5])
