"""Process-wide CPU settings a training run applies once at start: torch threads and how
the C allocator treats freed memory.

glibc hands every freed block above its mmap threshold (128 KiB, adapting up to 32 MiB)
back to the kernel, and a worker thread's arena cannot hold a block over 64 MiB at all, so
a loop that allocates a fresh ``[rows, vocab]`` tensor each iteration pays page faults on
every touch of it. On a small CPU that can cost more than the arithmetic
(``benchmarks/learner_step.py`` compares both allocators). ``reuse`` raises both thresholds and
puts every thread on the main arena, so freed memory stays in the process for the next
allocation, as PyTorch's caching allocator does on a GPU. The price: resident memory stays
near its peak. It is opt in (``orchestrator.cpu_allocator: reuse``).

The default, ``compact``, only puts every thread on the main arena and leaves glibc's
thresholds as they are. Each thread that allocates otherwise gets an arena of its own: the
sampler's thread, the learner's thread, oneDNN's and OpenMP's workers. Memory one thread
freed then cannot serve another's next tensor, and the process holds several peaks'
worth. In ``benchmarks/vs_trl.py``'s synchronous run (sampler and learner threads in one
process, oneDNN linears) it took the peak RSS from 4,940 to 4,468-4,519 MB, and the step
from 9.28 to 8.34-8.40 s (docs/performance.md). ``system`` leaves the process's allocator
as it is. Threads that allocated before the call keep their own arena, so apply it first
thing (a run does, in its process settings).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform
from typing import Literal, get_args

log = logging.getLogger(__name__)

# mallopt(3) parameter numbers from glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# blocks larger than this still come from (and go back to) the kernel directly
REUSE_MMAP_THRESHOLD = 1 << 30
# free memory at the top of the heap kept before any is handed back
REUSE_TRIM_THRESHOLD = (1 << 31) - 1

Allocator = Literal["compact", "reuse", "system"]
ALLOCATORS: tuple[str, ...] = get_args(Allocator)


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (``avx2``, ``fma``, ``amx_bf16``, ...);
    empty where there is no such file."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def set_allocator(mode: Allocator) -> bool:
    """Apply `mode` to glibc's malloc; returns whether anything was changed.

    ``compact``: one arena for every thread, glibc's thresholds as they are. ``reuse``: one
    arena, and freed memory kept for reuse. ``system`` changes nothing: glibc's defaults,
    unless another mode was applied earlier in this process (the setting is process-wide
    and is not undone). Off glibc (macOS, musl) all are no-ops.
    """
    if mode not in ALLOCATORS:
        raise ValueError(
            f"orchestrator.cpu_allocator must be 'compact', 'reuse' or 'system' (got {mode!r})"
        )
    if mode == "system" or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    ok = libc.mallopt(_M_ARENA_MAX, ctypes.c_int(1)) == 1
    if mode == "reuse":
        ok = libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(REUSE_MMAP_THRESHOLD)) == 1 and ok
        ok = libc.mallopt(_M_TRIM_THRESHOLD, ctypes.c_int(REUSE_TRIM_THRESHOLD)) == 1 and ok
    if not ok:
        log.warning("mallopt refused the allocator thresholds; freed memory goes back to the OS")
    return ok


def release_freed_memory() -> bool:
    """Hand the C heap's free pages back to the kernel (glibc ``malloc_trim``); returns
    whether it could. Call it after dropping something large for good (a copy of the
    weights the sampler no longer needs): under ``reuse`` nothing is trimmed on its own, so
    the freed pages would stay resident, counted in the process's memory for the whole run.
    Off glibc a no-op."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    import gc

    gc.collect()
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    return bool(libc.malloc_trim(ctypes.c_size_t(0)))


def set_threads(threads: int | None, asynchronous: bool) -> int:
    """torch intra-op threads: `threads`, or every core for a synchronous run and half of
    them when the sampler and the learner compute at the same time (oversubscribed OpenMP
    threads made both several times slower on 2 cores)."""
    import torch

    if threads is None:
        cores = os.cpu_count() or 1
        threads = max(1, cores // 2) if asynchronous else cores
    torch.set_num_threads(threads)
    return threads


def learner_process_threads(threads: int | None, learner_threads: int | None) -> int:
    """torch threads of a learner in its own process (``orchestrator.learner_worker``):
    `learner_threads`, else `threads`, else every core. With its idle OpenMP threads asleep
    (OMP_WAIT_POLICY=PASSIVE) the learner then takes the cores the sampler leaves idle
    between batches, where half of them left one core waiting: benchmarks/vs_trl.py async
    fp32 on 2 cores, 19.5 vs 26.9 s/step (docs/vs_trl.md)."""
    import torch

    chosen = learner_threads or threads or os.cpu_count() or 1
    torch.set_num_threads(chosen)
    return chosen
