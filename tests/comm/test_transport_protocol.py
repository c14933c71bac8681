"""One conformance suite over every transport: each implements the whole written ``Transport``
protocol, on two real gloo ranks (stage 0 sends forward, stage 1 sends backward on link 0)."""

from __future__ import annotations

import pytest

from tests.launch import run_ranks

KINDS = ("torch", "recorded", "emulated", "link", "delegate", "failover", "auto")


def _make(kind: str, rank: int, world: int, epoch: float):
    from titan_morph.comm import (
        DelegateTransport,
        EmulatedTransport,
        FailoverTransport,
        LinkGroups,
        LinkTransport,
        RecordedTransport,
        TorchTransport,
    )
    from titan_morph.pipelining.core.links import StaticDelays

    where = {"stage": rank, "num_stages": world, "epoch": epoch}
    links = StaticDelays((5.0,))
    if kind == "torch":
        return TorchTransport(epoch)
    if kind == "recorded":
        return RecordedTransport(TorchTransport(epoch), **where)
    if kind == "emulated":
        return EmulatedTransport(TorchTransport(epoch), links, depth=2, **where)
    if kind == "link":
        return LinkTransport(LinkGroups(stage=rank, num_stages=world, namespace="conformance-link"), epoch=epoch)
    if kind == "delegate":
        return DelegateTransport(links=links, **where)
    if kind == "auto":  # as make_transport builds it on the real network: recorded per-link groups
        pairs = LinkGroups(stage=rank, num_stages=world, namespace="conformance-auto")
        primary = RecordedTransport(LinkTransport(pairs, epoch=epoch), **where)
        delegate = DelegateTransport(**where, strict=False)
        return FailoverTransport(primary, delegate, stage=rank, num_stages=world, pairs=pairs)
    primary = EmulatedTransport(TorchTransport(epoch), links, depth=2, **where)
    return FailoverTransport(primary, DelegateTransport(links=links, **where), stage=rank, num_stages=world)


def _exchange(t, rank: int, value: float) -> tuple[list[float], list]:
    """One message each way on link 0; returns what arrived and the handles."""
    import torch
    import torch.distributed as dist

    peer = 1 - rank
    buf = torch.empty(4)
    recvs = t.batch_p2p([dist.P2POp(dist.irecv, buf, peer)])
    sends = t.batch_p2p([dist.P2POp(dist.isend, torch.full((4,), value + rank), peer)])
    for h in recvs + sends:
        h.wait(30.0)
    return buf.tolist(), recvs + sends


def _conformance(rank: int, world: int) -> dict:
    import time

    import torch.distributed as dist

    from titan_morph.comm import Handle, Transport, sync_clock

    clock = sync_clock()
    out = {}
    for kind in KINDS:
        t = _make(kind, rank, world, clock.epoch)
        r: dict = {
            "is_transport": isinstance(t, Transport),
            "epoch": t.epoch == clock.epoch,
            "now": 0 <= t.now_ms() < 600_000,
        }
        t.set_step(1)
        t.hint_issue(time.monotonic(), 2.0)
        got, handles = _exchange(t, rank, 10.0)
        r["received"] = got
        r["handles"] = all(isinstance(h, Handle) for h in handles)
        recv = handles[0]
        r["recv_record"] = None if recv.record is None else (recv.record.side, recv.record.link, recv.record.direction)
        r["recv_waited"] = recv.record is not None and recv.record.waited is not None
        snapshot, taken = t.records(), t.take_records()
        r["records"] = sorted((m.side, m.link, m.direction, m.seq, m.path) for m in taken)
        r["snapshot"] = len(snapshot) == len(taken)
        r["taken_twice"] = len(t.take_records())
        r["blocked"] = isinstance(t.blocked_ms(), dict)
        r["delegated"] = sorted(t.delegated())
        try:
            t.switch([0])
            r["switched"] = sorted(t.delegated())
        except ValueError as e:
            r["switched"] = str(e)
        t.set_step(2)
        got, _ = _exchange(t, rank, 20.0)
        r["received_after_switch"] = got
        r["paths_after_switch"] = sorted({m.path for m in t.take_records()})
        t.restore([0])
        r["restored"] = sorted(t.delegated())
        r["failovers"] = t.failovers
        t.close()
        t.close()  # idempotent
        dist.barrier()
        out[kind] = r
    return out


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_ranks(_conformance, 2, timeout=240, pg_timeout_s=60)


@pytest.mark.parametrize("kind", KINDS)
def test_every_transport_implements_the_protocol(results: list[dict], kind: str) -> None:
    for rank, per_rank in enumerate(results):
        r = per_rank[kind]
        peer = 1 - rank
        assert r["is_transport"] and r["epoch"] and r["now"] and r["handles"] and r["blocked"], r
        assert r["received"] == [10.0 + peer] * 4 and r["received_after_switch"] == [20.0 + peer] * 4, r
        assert r["taken_twice"] == 0 and r["snapshot"], r
        assert r["failovers"] == 0, r
        mine, theirs = ("fwd", "bwd") if rank == 0 else ("bwd", "fwd")
        if kind in ("torch", "link"):  # no records, no delegated path
            assert r["records"] == [] and r["recv_record"] is None, r
        else:
            path = {
                "recorded": "torch",
                "emulated": "emulated",
                "delegate": "delegate",
                "failover": "emulated",
                "auto": "torch",
            }
            path = path[kind]
            assert r["records"] == [("recv", 0, theirs, 0, path), ("send", 0, mine, 0, path)], r
            assert r["recv_record"] == ("recv", 0, theirs) and r["recv_waited"], r
        if kind in ("torch", "recorded", "emulated", "link"):
            assert r["delegated"] == [] and "no delegated path" in r["switched"] and r["restored"] == [], r
        elif kind == "delegate":
            assert r["delegated"] == r["switched"] == r["restored"] == [0], r
            assert r["paths_after_switch"] == ["delegate"], r
        else:  # failover: switch moves the link to the delegates, restore brings it back
            assert r["delegated"] == [] and r["switched"] == [0] and r["restored"] == [], r
            assert r["paths_after_switch"] == ["delegate"], r
