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

``tcmalloc`` replaces glibc's malloc with gperftools' tcmalloc (Debian's
``libtcmalloc-minimal4``, which ``make setup`` installs), which PyTorch's CPU tuning guide
and vLLM's CPU notes recommend preloading. It keeps freed memory in size classes for the
next tensor without the page faults glibc's thresholds cost, and without ``reuse``'s
growth. A library that replaces malloc must be loaded when the process starts
(``LD_PRELOAD``), so ``agentrl train`` restarts itself once with it (``agentrl.cli``) and
a run starts its learner process with it (:func:`allocator_env`). Measured on
``benchmarks/vs_trl.py``'s workload, float32, 2-core EPYC (docs/performance.md,
"tcmalloc"; ``benchmarks/allocators.py``): the learner alone, micro-batches of 4, 5.22 ->
4.24 s a step and peak RSS 3,803 -> 3,609 MB; micro-batches of 8, 4.40 -> 3.62 s and 4,414
-> 3,947 MB. Returning freed memory at once instead (jemalloc with no decay, tcmalloc's
aggressive decommit) halved the speed. ``auto``, the default, is ``tcmalloc`` where the
library is installed and ``compact`` elsewhere (macOS, musl, a machine without it); a
process that was started without it (a script calling the library, a Ray actor) gets
``compact``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, get_args

from agentrl.errors import ConfigError

log = logging.getLogger(__name__)

# mallopt(3) parameter numbers from glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# blocks larger than this still come from (and go back to) the kernel directly
REUSE_MMAP_THRESHOLD = 1 << 30
# free memory at the top of the heap kept before any is handed back
REUSE_TRIM_THRESHOLD = (1 << 31) - 1

Allocator = Literal["auto", "tcmalloc", "compact", "reuse", "system"]
ALLOCATORS: tuple[str, ...] = get_args(Allocator)
# gperftools' tcmalloc: the minimal build (no heap profiler), then the full one
TCMALLOC_LIBRARIES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
# tcmalloc reports every allocation over 1 GiB on stderr by default; a large batch's logits
# are not news
_TCMALLOC_QUIET = {"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(1 << 40)}
_KEY = "orchestrator.cpu_allocator"


def _glibc_linux() -> bool:
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@functools.cache
def tcmalloc_library() -> str | None:
    """The path of gperftools' tcmalloc on this machine (None where it is not installed,
    or off glibc Linux)."""
    if not _glibc_linux():
        return None
    for name in TCMALLOC_LIBRARIES:
        for folder in (
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu",
            "/usr/lib64",
            "/usr/lib",
        ):
            path = Path(folder) / name
            if path.exists():
                return str(path)
    found = ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")
    return found or None


@functools.cache
def tcmalloc_loaded() -> bool:
    """Whether this process runs on tcmalloc (it was started with it preloaded: fixed for the
    process's life, so read once)."""
    try:
        return "libtcmalloc" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def resolve_allocator(mode: str) -> str:
    """The allocator `mode` means on this machine: ``auto`` is ``tcmalloc`` where the library
    is installed, else ``compact``; ``tcmalloc`` without the library is a ConfigError."""
    check_allocator(mode)
    if mode == "auto":
        return "tcmalloc" if tcmalloc_library() else "compact"
    if mode == "tcmalloc" and tcmalloc_library() is None:
        raise ConfigError(
            f"{_KEY}=tcmalloc, but gperftools' tcmalloc is not installed here "
            "(apt-get install libtcmalloc-minimal4, which make setup does as root); "
            f"or set {_KEY}: auto or compact"
        )
    return mode


def check_allocator(mode: str) -> str:
    if mode not in ALLOCATORS:
        raise ValueError(f"{_KEY} must be one of {', '.join(map(repr, ALLOCATORS))} (got {mode!r})")
    return mode


def describe_allocator(mode: str) -> str:
    """What this process allocates with under `mode`, for a run's log."""
    if tcmalloc_loaded():
        return f"tcmalloc ({_KEY}={mode})"
    chosen = resolve_allocator(mode)
    if chosen == "tcmalloc":
        return f"glibc, compact ({_KEY}={mode}; this process started without tcmalloc)"
    return f"glibc, {chosen} ({_KEY}={mode})"


def allocator_env(mode: str, env: Mapping[str, str]) -> dict[str, str]:
    """`env` for a process this one starts, with tcmalloc preloaded when `mode` resolves to
    it (``LD_PRELOAD``, ahead of what was there); otherwise `env` unchanged."""
    out = dict(env)
    if resolve_allocator(mode) != "tcmalloc":
        return out
    library = tcmalloc_library()
    assert library is not None
    preload = [p for p in out.get("LD_PRELOAD", "").replace(":", " ").split() if p]
    if not any("libtcmalloc" in p for p in preload):
        out["LD_PRELOAD"] = " ".join([library, *preload])
    for key, value in _TCMALLOC_QUIET.items():
        out.setdefault(key, value)
    return out


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


def _forget_preload() -> None:
    """Take tcmalloc out of this process's ``LD_PRELOAD`` (it stays loaded): a tool, a
    grader or an agent program this process starts should not inherit a malloc it never
    asked for."""
    kept = [p for p in os.environ.get("LD_PRELOAD", "").split() if "libtcmalloc" not in p]
    if kept:
        os.environ["LD_PRELOAD"] = " ".join(kept)
    else:
        os.environ.pop("LD_PRELOAD", None)
    for key, value in _TCMALLOC_QUIET.items():
        if os.environ.get(key) == value:
            del os.environ[key]


# set in the environment of the process :func:`restart_with_allocator` starts: a second
# restart is never tried, whatever happened to the preload
RESTARTED_ENV = "AGENTRL_ALLOCATOR_RESTARTED"


def restart_with_allocator(mode: str) -> None:
    """Replace this process by the same command with tcmalloc preloaded (``os.execve`` of
    ``sys.orig_argv``: same PID, same arguments) when `mode` resolves to ``tcmalloc`` and
    this process runs without it. Returns when there is nothing to do: another allocator,
    tcmalloc already loaded, or a restart already tried (then a warning says the preload
    did not take). Only for a program's own entry point, before it starts threads or
    writes files: ``agentrl train`` calls it once its config is read."""
    if resolve_allocator(mode) != "tcmalloc":
        return
    if tcmalloc_loaded():
        if os.environ.pop(RESTARTED_ENV, None):  # the restarted process: its own children
            _forget_preload()  # get tcmalloc by allocator_env, not by inheritance
        return
    if os.environ.get(RESTARTED_ENV):
        log.warning(
            "%s: restarted with LD_PRELOAD=%s but tcmalloc is not loaded (a setuid program, "
            "or the dynamic loader refused it); continuing on glibc ('compact')",
            _KEY,
            tcmalloc_library(),
        )
        return
    env = allocator_env(mode, os.environ)
    env[RESTARTED_ENV] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def set_allocator(mode: Allocator) -> bool:
    """Apply `mode` to glibc's malloc; returns whether anything was changed.

    ``auto`` / ``tcmalloc``: nothing where this process runs on tcmalloc, else ``compact``
    (the library can only be preloaded at start: :func:`allocator_env`). ``compact``: one
    arena for every thread, glibc's thresholds as they are. ``reuse``: one arena, and freed
    memory kept for reuse. ``system`` changes nothing: glibc's defaults,
    unless another mode was applied earlier in this process (the setting is process-wide
    and is not undone). Off glibc (macOS, musl) all are no-ops.
    """
    mode = resolve_allocator(mode)
    if mode == "tcmalloc":
        if tcmalloc_loaded():
            return False  # malloc is tcmalloc's: nothing of glibc's to set
        log.info("%s: this process started without tcmalloc (LD_PRELOAD); it uses 'compact'", _KEY)
        mode = "compact"
    if mode == "system" or not _glibc_linux():
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
    """Hand the C heap's free pages back to the kernel (glibc ``malloc_trim``, or tcmalloc's
    ``ReleaseFreeMemory`` in a process that runs on it); returns
    whether it could. Call it after dropping something large for good (a copy of the
    weights the sampler no longer needs): under ``reuse`` nothing is trimmed on its own, so
    the freed pages would stay resident, counted in the process's memory for the whole run.
    Off glibc a no-op."""
    if not _glibc_linux():
        return False
    import gc

    gc.collect()
    if tcmalloc_loaded():  # tcmalloc's free lists, not glibc's (empty) heap
        try:
            ctypes.CDLL(None).MallocExtension_ReleaseFreeMemory()
            return True
        except AttributeError:
            return False
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
