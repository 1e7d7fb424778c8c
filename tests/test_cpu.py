import json
import platform
import subprocess
import sys

import pytest

from agentrl.cpu import set_allocator, set_threads

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
        ValueError, match=r"orchestrator\.cpu_allocator.*'compact', 'reuse' or 'system'"
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
