"""Clock offsets between pipeline ranks, estimated once at start-up (no synchronized clocks assumed).

Each rank's ``time.monotonic()`` is compared with group rank 0's by ``rounds`` ping-pongs over the
CPU group (NTP's method): rank 0 sends at ``t0`` and hears back at ``t1``; the peer stamped ``t``
in between, so its offset is ``t − (t0 + t1)/2`` within ±RTT/2. The round with the smallest RTT
is kept. On one host all processes share ``CLOCK_MONOTONIC`` and the offsets come out ≈ 0 (a
check of the method); across hosts they make a sender's and a receiver's stamps comparable.
Drift over a run is not tracked (monotonic clocks drift by ~ppm: ≈ 1 ms per 20 min).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["ClockOffsets", "estimate_offsets"]


@dataclass(frozen=True)
class ClockOffsets:
    """Per group rank: its clock minus rank 0's (ms), and the round trip that bounds the error."""

    offset_ms: tuple[float, ...]
    rtt_ms: tuple[float, ...]

    def error_ms(self, rank: int) -> float:
        return self.rtt_ms[rank] / 2.0


def estimate_offsets(
    group: dist.ProcessGroup, rounds: int = 8, clock: Callable[[], float] = time.monotonic
) -> ClockOffsets:
    """Collective over ``group`` (a CPU/gloo group): every rank returns the same offsets."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    offsets = torch.zeros(size, dtype=torch.float64)
    rtts = torch.zeros(size, dtype=torch.float64)
    buf = torch.zeros(1, dtype=torch.float64)
    for peer in range(1, size):
        if rank == 0:
            best_rtt, best_off = float("inf"), 0.0
            for _ in range(rounds):
                t0 = clock()
                dist.send(torch.tensor([t0], dtype=torch.float64), group=group, group_dst=peer)
                dist.recv(buf, group=group, group_src=peer)
                t1 = clock()
                if t1 - t0 < best_rtt:
                    best_rtt, best_off = t1 - t0, float(buf.item()) - (t0 + t1) / 2.0
            offsets[peer], rtts[peer] = best_off * 1e3, best_rtt * 1e3
        elif rank == peer:
            for _ in range(rounds):
                dist.recv(buf, group=group, group_src=0)
                buf[0] = clock()
                dist.send(buf, group=group, group_dst=0)
    dist.broadcast(offsets, group=group, group_src=0)
    dist.broadcast(rtts, group=group, group_src=0)
    return ClockOffsets(tuple(offsets.tolist()), tuple(rtts.tolist()))
