"""torch's intra-op thread count for a block of work.

Measured on 2 shared cores: small models (the diagnostic critics, batches of the demo encoder) split over 2
threads did a fraction of the work of one thread per task, and slowed ~10x when another job held a core, since
every op waits for its slowest thread. Such work runs on one thread; parallelism comes from running tasks side
by side (extraction's encoder workers) instead.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def intra_op_threads(n: int | None):
    """torch.set_num_threads(n) for the block (process-wide in torch), restored after; None changes nothing."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if n:
            torch.set_num_threads(before)
