"""Per-message arrival stamps: ``MessageRecord.arrived`` is when the data reached this
rank's receive path, whatever the consumer was doing; ``completed`` stays the consumer's wait.

Real gloo ranks (and real delegate processes). Timing bounds are loose: the host is shared.
"""

from __future__ import annotations

import threading
import time
import types

import pytest

from tests.launch import run_ranks

DELAY_MS = 80.0
LATE_S = 0.45  # the receiver waits this long after posting (> DELAY_MS: it is busy when data comes)
ROUNDS = 2


def _payload(step: int, direction: str = "fwd", shape: tuple[int, ...] = (64, 33)):
    import torch

    g = torch.Generator().manual_seed(1000 * step + (1 if direction == "bwd" else 0))
    return torch.randn(shape, generator=g)


def _late_consumer(rank: int, world: int, kind: str) -> dict:
    """Stage 0 sends one message per round on link 0 (80 ms); stage 1 posts the receive first, then
    is busy for LATE_S before it waits."""
    import torch
    import torch.distributed as dist

    from titan_morph.comm import sync_clock
    from titan_morph.pipelining.core.links import StaticDelays

    links = StaticDelays((DELAY_MS,))
    clock = sync_clock()
    epoch = clock.epoch
    if kind == "emulated":
        from titan_morph.comm import EmulatedTransport, TorchTransport

        tr = EmulatedTransport(TorchTransport(), links, stage=rank, num_stages=world, depth=2, epoch=epoch)
    else:
        from titan_morph.comm.delegate.transport import DelegateTransport
        from titan_morph.comm.timeouts import CommTimeouts

        tr = DelegateTransport(stage=rank, num_stages=world, links=links, epoch=epoch, timeouts=CommTimeouts.fixed(30))
    same = True
    with tr:
        for step in range(ROUNDS):
            tr.set_step(step)
            if rank == 0:
                dist.barrier()
                (h,) = tr.batch_p2p([dist.P2POp(dist.isend, _payload(step), 1)])
                h.wait(10.0)
            else:
                buf = torch.empty(64, 33)
                (h,) = tr.batch_p2p([dist.P2POp(dist.irecv, buf, 0)])
                dist.barrier()
                time.sleep(LATE_S)  # busy: the data arrives meanwhile
                h.wait(10.0)
                same = same and torch.equal(buf, _payload(step))
            dist.barrier()
        records = tr.take_records()
    gathered: list = [None] * world
    dist.all_gather_object(gathered, records)
    threads = [t.name for t in threading.enumerate()]
    return {"same": same, "records": gathered, "clock_error_ms": _pair_error(clock), "threads": threads}


def _pair_error(clock) -> float:
    """The bound on comparing stamps of ranks 0 and 1: each offset is known within RTT/2 (comm/clock.py)."""
    return clock.error_ms(0) + clock.error_ms(1)


@pytest.mark.parametrize("kind", ["emulated", "delegate"])
def test_arrival_is_stamped_while_the_consumer_is_busy(kind: str) -> None:
    sender, receiver = run_ranks(_late_consumer, 2, kind, timeout=120)
    assert receiver["same"]
    sends, recvs = sender["records"]
    sends = {r.seq: r for r in sends if r.side == "send"}
    recvs = [r for r in recvs if r.side == "recv"]
    assert len(recvs) == len(sends) == ROUNDS
    for r in recvs:
        s = sends[r.seq]
        assert r.path == s.path == kind and (r.link, r.direction) == (s.link, s.direction) == (0, "fwd")
        assert r.status == "done" and r.nbytes == s.nbytes
        delivery, observed = r.arrived - s.accepted, r.completed - s.accepted
        print(f"{kind} message {r.seq}: arrived - accepted {delivery:.2f} ms, completed - accepted {observed:.1f} ms")
        assert DELAY_MS - 0.5 - sender["clock_error_ms"] <= delivery <= DELAY_MS + 30.0
        assert observed >= 400.0 and r.arrived <= r.completed
    assert not [t for t in receiver["threads"] + sender["threads"] if t.startswith("titan_morph")]


def _failover_records(rank: int, world: int) -> dict:
    """One message each way on the emulated primary, switch link 0 to the delegates, one more."""
    import torch
    import torch.distributed as dist

    from titan_morph.comm import EmulatedTransport, TorchTransport, sync_clock
    from titan_morph.comm.delegate.transport import DelegateTransport
    from titan_morph.comm.failover.transport import FailoverTransport
    from titan_morph.comm.timeouts import CommTimeouts
    from titan_morph.pipelining.core.links import StaticDelays

    links = StaticDelays((5.0,), (3.0,))
    clock = sync_clock()
    epoch = clock.epoch
    primary = EmulatedTransport(TorchTransport(), links, stage=rank, num_stages=world, depth=2, epoch=epoch)
    delegate = DelegateTransport(
        stage=rank, num_stages=world, links=links, epoch=epoch, timeouts=CommTimeouts.fixed(30)
    )
    mine, theirs, peer = ("fwd", "bwd", 1) if rank == 0 else ("bwd", "fwd", 0)
    same = True
    with FailoverTransport(primary, delegate, stage=rank, num_stages=world) as tr:
        assert tr.epoch == epoch
        for step in (1, 2):
            if step == 2:
                tr.switch([0])
            tr.set_step(step)
            buf = torch.empty(8, 5)
            (r,) = tr.batch_p2p([dist.P2POp(dist.irecv, buf, peer)])
            (s,) = tr.batch_p2p([dist.P2POp(dist.isend, _payload(step, mine, (8, 5)), peer)])
            r.wait(10.0)
            s.wait(10.0)
            same = same and torch.equal(buf, _payload(step, theirs, (8, 5)))
            dist.barrier()
        snapshot = tr.records()
        taken = tr.take_records()
        left = tr.take_records()
    gathered: list = [None] * world
    dist.all_gather_object(gathered, taken)
    out = {"same": same, "records": gathered, "snapshot": len(snapshot), "left": len(left)}
    return out | {"clock_error_ms": _pair_error(clock)}


def test_failover_take_records_covers_both_paths() -> None:
    results = run_ranks(_failover_records, 2, timeout=120)
    for res in results:
        assert res["same"] and res["left"] == 0 and res["snapshot"] == 4
    records = [r for recs in results[0]["records"] for r in recs]
    assert {r.path for r in records} == {"emulated", "delegate"}
    sends = {(r.path, r.link, r.direction, r.seq): r for r in records if r.side == "send"}
    recvs = {(r.path, r.link, r.direction, r.seq): r for r in records if r.side == "recv"}
    assert set(sends) == set(recvs) and len(sends) == 4  # per path, both directions, seq 0
    for key, r in recvs.items():
        s = sends[key]
        delay = 5.0 if key[2] == "fwd" else 3.0
        assert r.arrived is not None and r.arrived - s.accepted >= delay - 0.5 - results[0]["clock_error_ms"]
        assert r.step == s.step == (1 if key[0] == "emulated" else 2)


def test_failover_rejects_transports_with_different_epochs() -> None:
    from titan_morph.comm.failover.transport import FailoverTransport

    group = types.SimpleNamespace(group_name="pp")
    with pytest.raises(ValueError, match="share one epoch"):
        FailoverTransport(
            types.SimpleNamespace(epoch=1.0),
            types.SimpleNamespace(epoch=2.0, group=group),
            stage=0,
            num_stages=2,
        )


def _recorded(rank: int, world: int) -> dict:
    """Plain torch P2P through RecordedTransport: single-op, multi-op and mixed (send + recv) batches,
    plus traffic on another group that passes through unrecorded."""
    import torch
    import torch.distributed as dist

    from titan_morph.comm import TorchTransport, sync_clock
    from titan_morph.comm.recorded import RecordedTransport

    other = dist.new_group([0, 1])
    epoch = sync_clock().epoch
    before = sorted(t.name for t in threading.enumerate())
    mine, theirs, peer = ("fwd", "bwd", 1) if rank == 0 else ("bwd", "fwd", 0)
    same = []
    with RecordedTransport(TorchTransport(), stage=rank, num_stages=world, epoch=epoch) as tr:
        assert tr.epoch == epoch and tr.path == "torch"
        for step in range(3):
            tr.set_step(step)
            a, b = torch.empty(8, 5), torch.empty(3)
            if step == 0:  # separate calls: all-recv (2 ops, one message), then all-send
                recv = tr.batch_p2p([dist.P2POp(dist.irecv, a, peer), dist.P2POp(dist.irecv, b, peer)])
                send = tr.batch_p2p(
                    [
                        dist.P2POp(dist.isend, _payload(step, mine, (8, 5)), peer),
                        dist.P2POp(dist.isend, _payload(step, mine, (3,)), peer),
                    ]
                )
            else:  # one mixed batch (batch_isend_irecv)
                both = tr.batch_p2p(
                    [
                        dist.P2POp(dist.irecv, a, peer),
                        dist.P2POp(dist.irecv, b, peer),
                        dist.P2POp(dist.isend, _payload(step, mine, (8, 5)), peer),
                        dist.P2POp(dist.isend, _payload(step, mine, (3,)), peer),
                    ]
                )
                recv, send = [h for h in both if h.record.side == "recv"], [h for h in both if h.record.side == "send"]
            assert len(recv) == len(send) == 1
            for h in recv + send:
                h.wait(10.0)
            same.append(torch.equal(a, _payload(step, theirs, (8, 5))) and torch.equal(b, _payload(step, theirs, (3,))))
        c = torch.full((4,), float(rank))  # other group: passes through, not recorded
        (h,) = tr.batch_p2p([dist.P2POp(dist.isend if rank == 0 else dist.irecv, c, 1 - rank, group=other)])
        h.wait(10.0)
        same.append(torch.equal(c, torch.zeros(4)))
        records = tr.take_records()
    after = sorted(t.name for t in threading.enumerate())
    gathered: list = [None] * world
    dist.all_gather_object(gathered, records)
    return {"same": same, "records": gathered, "threads": (before, after)}


def test_recorded_transport_matches_sends_and_receives() -> None:
    results = run_ranks(_recorded, 2, timeout=90)
    for res in results:
        assert all(res["same"]), res["same"]
        before, after = res["threads"]
        assert before == after  # no threads of its own
    records = [r for recs in results[0]["records"] for r in recs]
    assert len(records) == 12  # 3 steps x 2 directions x (send, recv); other-group traffic unrecorded
    sends = {(r.link, r.direction, r.seq): r for r in records if r.side == "send"}
    recvs = {(r.link, r.direction, r.seq): r for r in records if r.side == "recv"}
    assert set(sends) == set(recvs) == {(0, d, seq) for d in ("fwd", "bwd") for seq in range(3)}
    for key, r in recvs.items():
        s = sends[key]
        assert r.path == s.path == "torch" and r.status == s.status == "done"
        assert r.nbytes == s.nbytes == (40 + 3) * 4 and r.step == s.step == key[2]
        assert s.accepted == s.issued and s.completed >= s.accepted
        assert r.arrived is None and r.completed >= r.issued


def _close_with_posted_receive(rank: int, world: int) -> dict:
    """Stage 1 posts a receive stage 0 never sends, then closes its transport."""
    import torch
    import torch.distributed as dist

    from titan_morph.comm import EmulatedTransport, TorchTransport, sync_clock
    from titan_morph.pipelining.core.links import StaticDelays

    epoch = sync_clock().epoch
    tr = EmulatedTransport(TorchTransport(), StaticDelays((1.0,)), stage=rank, num_stages=world, depth=2, epoch=epoch)
    out: dict = {}
    if rank == 1:
        (h,) = tr.batch_p2p([dist.P2POp(dist.irecv, torch.empty(4), 0)])
        time.sleep(0.3)
        out["watchers"] = [t.name for t in threading.enumerate() if t.name.startswith("titan_morph-recv")]
        t0 = time.monotonic()
        tr.close()
        out["close_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        try:
            h.wait(5.0)
        except RuntimeError as e:
            out["wait_error"] = (type(e).__name__, str(e), time.monotonic() - t0)
        out["left"] = [t.name for t in threading.enumerate() if t.name.startswith("titan_morph")]
    else:
        tr.close()
    dist.barrier()
    return out


def test_close_stops_a_watcher_waiting_for_a_message_that_never_comes() -> None:
    _, res = run_ranks(_close_with_posted_receive, 2, timeout=60)
    assert res["watchers"] == ["titan_morph-recv-link0-fwd"]
    assert res["close_s"] < 5.0 and res["left"] == []
    name, msg, took = res["wait_error"]
    assert name == "RuntimeError" and "closed" in msg and "link 0 (fwd)" in msg and took < 1.0
