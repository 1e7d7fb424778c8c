"""vLLM-CPU's environment variables, sized for this machine (set before an engine starts)."""

from __future__ import annotations

import os


def configure_cpu_env() -> None:
    """Size vLLM-CPU for this machine unless the user already set the variables."""
    cores = os.cpu_count() or 1
    # OpenMP's spinning barriers collapse when the cores are oversubscribed, so a busy
    # machine gets one thread
    busy = os.getloadavg()[0] > cores
    threads = "0" if cores == 1 or busy else f"0-{cores - 1}"
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", threads)
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB
