"""Timing helper shared by the planner benchmarks."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def timed(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    """Median wall ms and median CPU ms over ``reps`` calls (CPU time is robust to a busy box)."""
    walls, cpus = [], []
    for _ in range(reps):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append((time.perf_counter() - w0) * 1e3)
        cpus.append((time.process_time() - c0) * 1e3)
    return statistics.median(walls), statistics.median(cpus)
