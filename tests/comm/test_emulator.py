"""EmulatedTransport on real gloo ranks: delays, FIFO, payloads, blocking, time-varying models, link down."""

from __future__ import annotations

import math
import statistics
import time

import pytest

from .spawn_ranks import run_ranks

TOL_MS = 2.0


def _payload(link: int, direction: str, seq: int, numel: int):
    import torch

    g = torch.Generator().manual_seed(link * 100_000 + (50_000 if direction == "bwd" else 0) + seq)
    t = torch.randn(numel, generator=g)
    t[0] = seq
    return t


def _emulator(rank: int, world: int, model, depth=None, **kw):
    from titan_morph.comm import EmulatedTransport, TorchTransport, sync_epoch

    return EmulatedTransport(
        TorchTransport(), model, stage=rank, num_stages=world, depth=depth, epoch=sync_epoch(), **kw
    )


def _p2p(send: bool, tensor, peer: int):
    import torch.distributed as dist

    return dist.P2POp(dist.isend if send else dist.irecv, tensor, peer)


def _exchange(rank: int, world: int, model, n: int, gap_ms: float, depth=None, numel=(1, 256, 4096)) -> dict:
    """Every stage streams ``n`` messages to each neighbour (fwd to rank+1, bwd to rank-1); receivers
    wait in order as soon as possible. Returns records, payload checks and issue-call durations."""
    import threading

    import torch
    import torch.distributed as dist

    emu = _emulator(rank, world, model, depth)
    sends, recvs = [], []
    if rank + 1 < world:
        sends.append((rank, "fwd", rank + 1))
        recvs.append((rank, "bwd", rank + 1))
    if rank > 0:
        sends.append((rank - 1, "bwd", rank - 1))
        recvs.append((rank - 1, "fwd", rank - 1))
    size = lambda seq: numel[seq % len(numel)]  # noqa: E731
    bad: list[str] = []
    recv_handles = {}
    buffers = {}
    for link, d, peer in recvs:
        for seq in range(n):
            buffers[(link, d, seq)] = torch.empty(size(seq))
    dist.barrier()

    def receiver(link: int, d: str, peer: int) -> None:
        for seq in range(n):
            buf = buffers[(link, d, seq)]
            (h,) = emu.batch_p2p([_p2p(False, buf, peer)])
            recv_handles[(link, d, seq)] = h
            h.wait(10.0)
            if not torch.equal(buf, _payload(link, d, seq, size(seq))):
                bad.append(f"{link}{d}{seq}")

    threads = [threading.Thread(target=receiver, args=r) for r in recvs]
    for t in threads:
        t.start()
    issue_ms = []
    handles = []
    for seq in range(n):
        for link, d, peer in sends:
            t0 = time.monotonic()
            handles += emu.batch_p2p([_p2p(True, _payload(link, d, seq, size(seq)), peer)])
            issue_ms.append(((link, d, seq), (time.monotonic() - t0) * 1e3))
        time.sleep(gap_ms / 1e3)
    for h in handles:
        h.wait(10.0)
    for t in threads:
        t.join(20.0)
    emu.close()
    recs = emu.records()
    all_recs = [None] * world
    dist.all_gather_object(all_recs, recs)
    leftover = [t.name for t in threading.enumerate() if t.name.startswith("titan_morph")]
    return {"records": all_recs, "bad": bad, "issue_ms": issue_ms, "blocked": emu.blocked_ms, "threads": leftover}


def _delays(result: dict) -> list[tuple[object, float, float]]:
    """(message, intended delay, observed delay) with observed = receiver completion − sender acceptance."""
    records = [r for rank_recs in result["records"] for r in rank_recs]
    sends = {(r.link, r.direction, r.seq): r for r in records if r.side == "send"}
    out = []
    for r in records:
        if r.side == "recv":
            s = sends[(r.link, r.direction, r.seq)]
            assert s.status == r.status == "done"
            assert s.nbytes == r.nbytes
            out.append(((r.link, r.direction, r.seq), s.planned - s.accepted, r.completed - s.accepted, s, r))
    return out


def _report(name: str, delays) -> list[float]:
    errors = [obs - want for _, want, obs, *_ in delays]
    srt = sorted(errors)
    print(
        f"\n{name}: {len(errors)} msgs, delay error ms: min {srt[0]:.3f} median {statistics.median(srt):.3f} "
        f"p90 {srt[int(0.9 * (len(srt) - 1))]:.3f} max {srt[-1]:.3f}"
    )
    return errors


def test_static_delay_both_directions_fifo_payloads():
    from titan_morph.pipelining.links import StaticDelays

    n = 30
    res = run_ranks(_exchange, 2, StaticDelays((20.0,), (50.0,)), n, 5.0, timeout=60)
    for r in res:
        assert r["bad"] == [] and r["threads"] == []
    delays = _delays(res[0])
    assert len(delays) == 2 * n
    for (link, d, seq), want, *_ in delays:
        assert want == (20.0 if d == "fwd" else 50.0)
    errors = _report("static 20/50 ms", delays)
    assert min(errors) > -0.5, "a message arrived before its delay elapsed"
    assert statistics.median(errors) <= TOL_MS
    assert sum(e <= TOL_MS for e in errors) >= 0.9 * len(errors)
