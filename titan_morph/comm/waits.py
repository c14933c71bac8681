"""Waits that never block the host on the device queue (paper §5.3: the failover must act first).

On NCCL, ``Work.wait(timeout)`` makes the host block until the operation completes and, when the
timeout expires, lets NCCL abort the communicator itself; ``Work.wait()`` without a timeout only
orders the current stream after the operation. A wait here therefore polls ``is_completed()``
against the job's ``[comm]`` bound (backing off from ``first_s`` to ``max_s`` between polls) and
calls ``wait()`` only once the work is complete, so a slow or dead link ends in titan_morph's own
error, in time for the failover, and never in a host stuck inside NCCL.

On gloo a receive never reports completion before ``wait`` (it has no progress thread for it), so
gloo works keep their bounded ``wait(timeout)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["on_nccl", "poll_until"]

POLL_FIRST_S = 20e-6
POLL_MAX_S = 1e-3


def poll_until(
    done: Callable[[], bool],
    deadline: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    first_s: float = POLL_FIRST_S,
    max_s: float = POLL_MAX_S,
) -> bool:
    """Poll ``done()`` until it is true (True) or ``clock()`` passes ``deadline`` (False); never sleeps
    past the deadline, and checks once more at it."""
    delay = first_s
    while True:
        if done():
            return True
        now = clock()
        if now >= deadline:
            return bool(done())
        sleep(min(delay, deadline - now))
        delay = min(2 * delay, max_s)


def on_nccl(group: Any) -> bool:
    """Whether ``group``'s (None: the default group's) point-to-point traffic runs on NCCL, whose
    works report completion without ``wait`` and whose bounded ``wait`` blocks the host."""
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available() or not dist.is_initialized():
        return False
    if group is None:  # a P2POp without a group runs on the default one
        group = dist.group.WORLD
    try:
        return "nccl" in str(dist.get_backend(group)).lower()
    except (RuntimeError, ValueError):
        return False
