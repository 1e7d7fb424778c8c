"""What a process that runs part of a run sets first: allocator, torch threads, seeds.

The driver, the learner process and every Ray actor call :func:`apply_process_settings`
before they build anything, so a config means the same in each of them.
"""

from __future__ import annotations

import logging
import random

import numpy as np
import torch

from agentrl.config import Config
from agentrl.cpu import describe_allocator, set_allocator, set_threads
from agentrl.run.settings import is_asynchronous

log = logging.getLogger(__name__)


def apply_process_settings(cfg: Config) -> None:
    """Allocator, torch threads and seeds for a process that runs part of `cfg`.

    Call first thing: threads that allocated before keep their own malloc arena."""
    set_allocator(cfg.orchestrator.cpu_allocator)
    log.info("C allocator: %s", describe_allocator(cfg.orchestrator.cpu_allocator))
    set_threads(cfg.orchestrator.cpu_threads, asynchronous=is_asynchronous(cfg))
    seed = cfg.orchestrator.seed
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
