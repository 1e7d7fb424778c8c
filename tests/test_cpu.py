import json
import os
import platform
import subprocess
import sys

import pytest

from agentrl import cpu
from agentrl.cpu import allocator_env, resolve_allocator, set_allocator, set_threads
from agentrl.errors import ConfigError

_PROBE = r"""
import ctypes, json, sys, threading
import torch
from agentrl.cpu import set_allocator

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
changed = set_allocator(sys.argv[1])

def work():  # a worker thread, like the learner's and the sampler's
    x = torch.empty(128 << 20, dtype=torch.uint8)
    x.fill_(1)
    del x

t = threading.Thread(target=work)
t.start()
t.join()
info = libc.mallinfo2()
print(json.dumps({"changed": changed, "free_in_heap": info.fordblks, "mmapped": info.hblkhd}))
"""


def _probe(mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
def test_reuse_keeps_a_worker_threads_freed_block_in_the_process():
    reuse, system, compact = _probe("reuse"), _probe("system"), _probe("compact")
    assert reuse["changed"] and compact["changed"] and not system["changed"]
    # reuse: the 128 MiB block came from the main heap and stays there for the next tensor
    assert reuse["free_in_heap"] >= 128 << 20
    # system and compact: it was mmapped and went straight back to the kernel
    assert system["free_in_heap"] < 128 << 20
    assert compact["free_in_heap"] < 128 << 20


def test_bad_allocator_names_the_field():
    with pytest.raises(
        ValueError, match=r"orchestrator\.cpu_allocator must be one of 'auto', 'tcmalloc'"
    ):
        set_allocator("jemalloc")  # type: ignore[arg-type]
    assert set_allocator("system") is False


def test_threads_default_splits_cores_in_async_mode():
    import os

    import torch

    before = torch.get_num_threads()
    try:
        cores = os.cpu_count() or 1
        assert set_threads(None, asynchronous=False) == cores
        assert set_threads(None, asynchronous=True) == max(1, cores // 2)
        assert set_threads(1, asynchronous=False) == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


_TCMALLOC = cpu.tcmalloc_library()
needs_tcmalloc = pytest.mark.skipif(
    _TCMALLOC is None, reason="gperftools' tcmalloc not installed (make setup installs it)"
)
_LOADED = "from agentrl.cpu import tcmalloc_loaded; print(tcmalloc_loaded())"


def test_auto_is_tcmalloc_where_installed_and_compact_elsewhere(monkeypatch):
    assert resolve_allocator("auto") == ("tcmalloc" if _TCMALLOC else "compact")
    monkeypatch.setattr(cpu, "tcmalloc_library", lambda: None)
    assert resolve_allocator("auto") == "compact"
    assert allocator_env("auto", {"PATH": "/bin"}) == {"PATH": "/bin"}
    with pytest.raises(ConfigError, match=r"cpu_allocator=tcmalloc.*libtcmalloc-minimal4"):
        resolve_allocator("tcmalloc")
    assert resolve_allocator("reuse") == "reuse"


def test_allocator_env_preloads_tcmalloc_once_ahead_of_other_preloads(monkeypatch):
    monkeypatch.setattr(cpu, "tcmalloc_library", lambda: "/lib/libtcmalloc_minimal.so.4")
    env = allocator_env("auto", {"LD_PRELOAD": "/lib/other.so", "HOME": "/h"})
    assert env["LD_PRELOAD"] == "/lib/libtcmalloc_minimal.so.4 /lib/other.so"
    assert env["HOME"] == "/h" and "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD" in env
    assert allocator_env("tcmalloc", env)["LD_PRELOAD"] == env["LD_PRELOAD"]  # not twice
    assert "LD_PRELOAD" not in allocator_env("compact", {})


@needs_tcmalloc
def test_a_process_started_with_allocator_env_runs_on_tcmalloc():
    run = [sys.executable, "-c", _LOADED]
    plain = subprocess.run(run, capture_output=True, text=True, check=True)
    env = allocator_env("auto", os.environ)
    preloaded = subprocess.run(run, capture_output=True, text=True, check=True, env=env)
    assert (plain.stdout.strip(), preloaded.stdout.strip()) == ("False", "True")
    assert preloaded.stderr == ""  # no "large alloc" reports or loader complaints


_RESTART = """
import os, sys
from agentrl.cpu import restart_with_allocator, tcmalloc_loaded
print("start", sys.argv[1:], tcmalloc_loaded(), flush=True)
restart_with_allocator(sys.argv[1])
print("after", tcmalloc_loaded(), "LD_PRELOAD" in os.environ, flush=True)
import torch
x = torch.ones(3 << 28, dtype=torch.uint8)  # 768 MiB, one block: tcmalloc stays quiet
print("sum", int(x.sum()))
"""


@needs_tcmalloc
def test_restart_with_allocator_reruns_the_command_on_tcmalloc_once():
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", cpu.RESTARTED_ENV)}
    run = subprocess.run(
        [sys.executable, "-c", _RESTART, "auto"], capture_output=True, text=True, env=env
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    # the first start, then the same command again (same arguments) with tcmalloc, which
    # its own children no longer inherit
    assert lines == [
        "start ['auto'] False",
        "start ['auto'] True",
        "after True False",
        f"sum {3 << 28}",
    ]
    compact = subprocess.run(
        [sys.executable, "-c", _RESTART, "compact"], capture_output=True, text=True, env=env
    )
    assert compact.stdout.splitlines()[:2] == ["start ['compact'] False", "after False False"]
