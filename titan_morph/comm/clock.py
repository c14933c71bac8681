"""The pipeline's common clock: one epoch, the same instant on every rank, from one offset estimate.

Every time the transports, the monitor and the runtime report is in ms since this epoch, so a
sender's acceptance and a receiver's arrival compare directly, and the link model (delays keyed by
time since the run's start) reads the same time on both ends of a link.

Each rank's ``time.monotonic()`` is compared with group rank 0's by ``rounds`` ping-pongs (NTP's
method): rank 0 sends at ``t0`` and hears back at ``t1``; the peer stamped ``t`` in between, so its
offset is ``t - (t0 + t1)/2`` within +-RTT/2; the round with the smallest RTT is kept. Then rank 0
broadcasts one instant of its clock after a barrier (all ranks ready), and each rank's epoch is that
instant on its own clock. On one host all processes share ``CLOCK_MONOTONIC`` and the offsets come
out ~0 (a check of the method); across hosts they make the stamps comparable. Drift over a run is
not tracked (monotonic clocks drift by ~ppm: ~1 ms per 20 min).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from titan_morph.comm.groups import cpu_group
from titan_morph.comm.timeouts import DEFAULT_TIMEOUTS, CommTimeouts

__all__ = ["CommonClock", "sync_clock"]

# The ping-pong's own P2P tag: gloo matches point-to-point messages by (peer, tag), so a pipeline
# receive still posted on the same group (tag 0) can never swallow a clock message.
CLOCK_TAG = 0x7C10C


@dataclass(frozen=True)
class CommonClock:
    """This rank's view of the common clock: ``epoch`` (its ``time.monotonic()`` at t = 0) and, per
    group rank, the clock offset to rank 0 and the round trip that bounds its error (ms)."""

    epoch: float
    offset_ms: tuple[float, ...]
    rtt_ms: tuple[float, ...]

    def ms(self, monotonic_s: float) -> float:
        """A ``time.monotonic()`` value of this rank as ms on the common clock."""
        return (monotonic_s - self.epoch) * 1e3

    def now_ms(self) -> float:
        return self.ms(time.monotonic())

    def error_ms(self, rank: int) -> float:
        return self.rtt_ms[rank] / 2.0


def _offsets(group: dist.ProcessGroup, rounds: int, clock: Callable[[], float]) -> tuple[torch.Tensor, torch.Tensor]:
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    offsets = torch.zeros(size, dtype=torch.float64)
    rtts = torch.zeros(size, dtype=torch.float64)
    buf = torch.zeros(1, dtype=torch.float64)
    for peer in range(1, size):
        if rank == 0:
            best_rtt, best_off = float("inf"), 0.0
            for _ in range(rounds):
                t0 = clock()
                dist.send(torch.tensor([t0], dtype=torch.float64), group=group, group_dst=peer, tag=CLOCK_TAG)
                dist.recv(buf, group=group, group_src=peer, tag=CLOCK_TAG)
                t1 = clock()
                if t1 - t0 < best_rtt:
                    best_rtt, best_off = t1 - t0, float(buf.item()) - (t0 + t1) / 2.0
            offsets[peer], rtts[peer] = best_off * 1e3, best_rtt * 1e3
        elif rank == peer:
            for _ in range(rounds):
                dist.recv(buf, group=group, group_src=0, tag=CLOCK_TAG)
                buf[0] = clock()
                dist.send(buf, group=group, group_dst=0, tag=CLOCK_TAG)
    dist.broadcast(offsets, group=group, group_src=0)
    dist.broadcast(rtts, group=group, group_src=0)
    return offsets, rtts


def sync_clock(
    group: dist.ProcessGroup | None = None,
    rounds: int = 8,
    clock: Callable[[], float] = time.monotonic,
    timeouts: CommTimeouts = DEFAULT_TIMEOUTS,
) -> CommonClock:
    """Collective over ``group`` (on a gloo group over the same ranks when it is not gloo, bounded
    by ``timeouts``: the job's ``[comm]``): every rank returns the same offsets and its own
    ``epoch``, the same instant everywhere."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    pipeline = group if group is not None else dist.group.WORLD
    if pipeline is None:
        raise RuntimeError("sync_clock needs torch.distributed to be initialized")
    cpu = cpu_group(pipeline, timeouts=timeouts)
    offsets, rtts = _offsets(cpu, rounds, clock)
    dist.barrier(group=cpu)
    start = torch.tensor([clock()], dtype=torch.float64)
    dist.broadcast(start, group=cpu, group_src=0)  # t = 0: rank 0's clock, right after the barrier
    mine = float(offsets[dist.get_rank(cpu)].item())
    return CommonClock(float(start.item()) + mine / 1e3, tuple(offsets.tolist()), tuple(rtts.tolist()))
