"""Faults of the delegated data plane, on real gloo ranks with real delegate processes.

* stopped and continued (SIGSTOP 1 s, SIGCONT) root and delegates carry on, nothing lost;
* a killed delegate is reported at once, naming link, direction and the signal; its peer rank's
  waits raise ``DelegateError`` (not a timeout); without ``strict`` other directions keep working;
* a wait's bound follows the ``[comm]`` timeouts of the current step and its error names rank,
  link, direction and operation;
* ``close(drain=True)`` returns only once the peer's receive delegate holds every message;
* a send that fails midway leaves the link's state as it was (the next send takes its place);
* on CUDA, receive slots are released by polling their copy's event (a fake event here).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.comm.fakes import PollingEvent
from tests.launch import run_ranks
from titan_morph.comm.machine.system import process_name, process_table


def children(pid: int) -> list[int]:
    """Live child processes of ``pid``."""
    return sorted(child for child, (parent, state) in process_table().items() if parent == pid and state != "Z")


def _exchange(tr, rank: int, value: float, peer: int | None = None) -> list[float]:
    """One message each way on link 0 (ranks 0 and 1); what arrived."""
    import torch
    import torch.distributed as dist

    peer = 1 - rank if peer is None else peer
    buf = torch.empty(1000)
    handles = tr.batch_p2p([dist.P2POp(dist.irecv, buf, peer)])
    handles += tr.batch_p2p([dist.P2POp(dist.isend, torch.full((1000,), value + rank), peer)])
    for h in handles:
        h.wait(30.0)
    return sorted(set(buf.tolist()))


def _stop_and_continue(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from titan_morph.comm.delegate.transport import DelegateTransport

    out: dict = {}
    with DelegateTransport(stage=rank, num_stages=world) as tr:
        out["before"] = _exchange(tr, rank, 1.0)
        dist.barrier()
        root = tr.proc.pid
        stopped = [root, *children(root)]
        out["names"] = sorted(process_name(p) for p in stopped[1:])
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(1.0)  # far longer than the processes' 0.2 s polls
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.5)
        dist.barrier()
        out["after"] = _exchange(tr, rank, 2.0)
        out["alive"] = tr.proc.poll() is None and children(root) == stopped[1:]
        out["failed"] = [str(e) for e in tr.failed().values()]
    return out


def test_stopped_and_continued_delegates_carry_on() -> None:
    for rank, r in enumerate(run_ranks(_stop_and_continue, 2, timeout=120)):
        peer = 1 - rank
        assert r["before"] == [1.0 + peer] and r["after"] == [2.0 + peer], r
        assert r["alive"] and not r["failed"], r
        assert r["names"] == ["tm-recv-l0b0", "tm-send-l0f0"] if rank == 0 else ["tm-recv-l0f0", "tm-send-l0b0"]


def _kill_a_delegate(rank: int, world: int, strict: bool) -> dict:
    import threading

    import torch.distributed as dist

    from titan_morph.comm.delegate.transport import DelegateError, DelegateTransport
    from titan_morph.comm.timeouts import CommTimeouts

    out: dict = {"reports": []}
    heard = threading.Event()
    tr = DelegateTransport(stage=rank, num_stages=world, strict=strict, timeouts=CommTimeouts.fixed(60))
    tr.add_listener(lambda link, d, err: (out["reports"].append((link, d, str(err))), heard.set()))
    try:
        _exchange(tr, rank, 1.0)
        dist.barrier()
        if rank == 0:  # kill the send delegate of link 0 fwd
            (victim,) = [p for p in children(tr.proc.pid) if process_name(p) == "tm-send-l0f0"]
            os.kill(victim, signal.SIGKILL)
            out["victim"] = victim
        heard.wait(30.0)  # both ranks hear of it: rank 0 from the root, rank 1 from its receive delegate
        import torch

        if rank == 1:  # a receive on the dead pair fails with the delegate's error, not a timeout
            (h,) = tr.batch_p2p([dist.P2POp(dist.irecv, torch.empty(1000), 0)])
            try:
                h.wait()
                out["recv"] = "no error"
            except DelegateError as e:
                out["recv"] = f"DelegateError: {e}"
        dist.barrier()
        # the other direction (rank 1 -> rank 0, its own pair) still works unless strict
        try:
            if rank == 1:
                (h,) = tr.batch_p2p([dist.P2POp(dist.isend, torch.full((1000,), 7.0), 0)])
                h.wait()
                out["bwd"] = "sent"
            else:
                buf = torch.empty(1000)
                (h,) = tr.batch_p2p([dist.P2POp(dist.irecv, buf, 1)])
                h.wait(20.0)
                out["bwd"] = sorted(set(buf.tolist()))
        except DelegateError as e:
            out["bwd"] = f"DelegateError: {e}"
        dist.barrier()
    finally:
        tr.close(timeout=5.0, drain=False)
    return out


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "per-link"])
def test_a_killed_delegate_is_reported_at_once(strict: bool) -> None:
    r0, r1 = run_ranks(_kill_a_delegate, 2, strict, timeout=150)
    (link, d, msg) = r0["reports"][0]
    assert (link, d) == (0, "fwd"), r0
    assert "send delegate #0 of link 0 (fwd, peer stage 1)" in msg and "killed by SIGKILL" in msg, msg
    assert f"pid {r0['victim']}" in msg and "stage 0 (rank 0)" in msg, msg
    (link, d, msg) = r1["reports"][0]
    assert (link, d) == (0, "fwd") and "receive delegate #0 of link 0 (fwd, peer stage 0)" in msg, r1
    assert r1["recv"].startswith("DelegateError:") and "receive delegate #0 of link 0" in r1["recv"], r1
    if strict:
        assert r0["bwd"].startswith("DelegateError:") and r1["bwd"].startswith("DelegateError:"), (r0, r1)
    else:
        assert r0["bwd"] == [7.0] and r1["bwd"] == "sent", (r0, r1)


def _bounded_waits(rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist

    from titan_morph.comm import CommTimeoutError, EmulatedTransport, TorchTransport, sync_clock
    from titan_morph.comm.delegate.transport import DelegateTransport
    from titan_morph.comm.timeouts import CommTimeouts
    from titan_morph.pipelining.core.links import StaticDelays

    timeouts = CommTimeouts(init_s=30.0, train_s=1.0)
    epoch = sync_clock().epoch
    out: dict = {}
    transports = {
        "delegate": DelegateTransport(stage=rank, num_stages=world, timeouts=timeouts, epoch=epoch),
        "emulated": EmulatedTransport(
            TorchTransport(epoch),
            StaticDelays((0.0,)),
            stage=rank,
            num_stages=world,
            depth=2,
            epoch=epoch,
            timeouts=timeouts,
        ),
    }
    for kind, tr in transports.items():
        tr.set_step(1)
        out[f"{kind}_init"] = tr.timeout_s
        tr.set_step(2)
        if rank == 1:  # nobody sends: the wait ends after the training bound, naming what it waited for
            (h,) = tr.batch_p2p([dist.P2POp(dist.irecv, torch.empty(3), 0)])
            t0 = time.monotonic()
            try:
                h.wait()
                out[kind] = "no error"
            except CommTimeoutError as e:
                out[kind] = str(e)
            out[f"{kind}_s"] = time.monotonic() - t0
        dist.barrier()
        tr.close(timeout=2.0, drain=False)
        dist.barrier()
    return out


def test_waits_follow_the_comm_timeouts_and_name_what_they_waited_for() -> None:
    _, r = run_ranks(_bounded_waits, 2, timeout=120)
    for kind in ("delegate", "emulated"):
        assert r[f"{kind}_init"] == 30.0, r
        msg = r[kind]
        assert "receive of message 0 on link 0 (fwd) from stage 0" in msg and "within 1 s" in msg, msg
        assert "stage 1 (rank 1)" in msg, msg
        assert r[f"{kind}_s"] < 20.0, r  # the training bound (1 s), not the start-up one (30 s)


def _close_waits_for_the_peer(rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist

    from titan_morph.comm.delegate.transport import DelegateTransport

    out: dict = {}
    tr = DelegateTransport(stage=rank, num_stages=world)
    _exchange(tr, rank, 0.0)
    dist.barrier()
    n = 6
    if rank == 1:  # freeze the receive delegate of link 0 fwd: nothing rank 0 sends can arrive yet
        (rd,) = [p for p in children(tr.proc.pid) if process_name(p) == "tm-recv-l0f0"]
        os.kill(rd, signal.SIGSTOP)
        dist.barrier()
        dist.barrier()  # rank 0 has handed its messages over and started closing
        time.sleep(1.0)
        out["resumed"] = time.monotonic()
        os.kill(rd, signal.SIGCONT)
        bufs = [torch.empty(256) for _ in range(n)]
        handles = [tr.batch_p2p([dist.P2POp(dist.irecv, b, 0)])[0] for b in bufs]
        for h in handles:
            h.wait(30.0)
        out["ok"] = all(torch.equal(b, torch.full((256,), float(i))) for i, b in enumerate(bufs))
        tr.close()
    else:
        dist.barrier()
        for i in range(n):
            for h in tr.batch_p2p([dist.P2POp(dist.isend, torch.full((256,), float(i)), 1)]):
                h.wait()
        dist.barrier()
        tr.close()  # drain: returns once rank 1's (frozen, then resumed) receive delegate has them all
        out["closed"] = time.monotonic()
    return out


def test_close_with_drain_waits_until_the_peer_holds_every_message() -> None:
    r0, r1 = run_ranks(_close_waits_for_the_peer, 2, timeout=120)
    assert r1["ok"], r1
    assert r0["closed"] > r1["resumed"], "close(drain=True) returned before the peer could receive the messages"


def _failed_send_keeps_state(rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist

    from titan_morph.comm.delegate.transport import DelegateTransport

    out: dict = {}
    with DelegateTransport(stage=rank, num_stages=world) as tr:
        good = torch.arange(8, dtype=torch.float32)
        if rank == 0:
            dg = tr._delegates[(0, "fwd")][0]
            before = (dict(tr._send_seq), dict(dg.cursor), [list(s.issued) for s in dg.segments.values()])
            broken = torch.empty(8, device="meta")  # its copy into shared memory raises midway
            try:
                tr.batch_p2p([dist.P2POp(dist.isend, good, 1), dist.P2POp(dist.isend, broken, 1)])
                out["error"] = "none"
            except NotImplementedError as e:
                out["error"] = type(e).__name__
            seg_ids = dg.by_size.values()
            out["unchanged"] = (
                tr._send_seq == before[0]
                and all(dg.cursor[s] == 0 for s in seg_ids)
                and all(not any(dg.segments[s].issued) for s in seg_ids)
            )
            out["records"] = [(r.side, r.seq, r.status) for r in tr.take_records()]
            for h in tr.batch_p2p([dist.P2POp(dist.isend, good, 1), dist.P2POp(dist.isend, good + 1, 1)]):
                h.wait()
        else:
            bufs = [torch.empty(8), torch.empty(8)]
            (h,) = tr.batch_p2p([dist.P2POp(dist.irecv, b, 0) for b in bufs])
            h.wait(30.0)
            out["got"] = [b.tolist() for b in bufs]
        dist.barrier()
    return out


def test_a_send_that_fails_midway_leaves_the_link_as_it_was() -> None:
    r0, r1 = run_ranks(_failed_send_keeps_state, 2, timeout=90)
    assert r0["error"] == "NotImplementedError" and r0["unchanged"], r0
    assert r0["records"] == [], r0  # the failed send left no record
    assert r1["got"] == [list(map(float, range(8))), list(map(float, range(1, 9)))], r1


def test_receive_slots_are_released_when_their_copy_completes_without_blocking() -> None:
    from titan_morph.comm.delegate.transport import DeferredReleases

    released: list[int] = []
    pending = DeferredReleases()
    pending.add(PollingEvent(1), lambda: released.append(0))
    pending.add(PollingEvent(0), lambda: released.append(1))  # done, but released after the older one
    pending.add(PollingEvent(5), lambda: released.append(2))
    assert pending.poll() == 0 and released == [] and pending.pending() == 3
    assert pending.poll() == 2 and released == [0, 1] and pending.pending() == 1
    for _ in range(4):
        pending.poll()
    assert released == [0, 1] and pending.poll() == 1 and released == [0, 1, 2] and pending.pending() == 0


def test_a_failed_pin_names_the_cuda_error_and_clears_it(monkeypatch, tmp_path) -> None:
    import torch

    from titan_morph.comm.delegate import shm

    class FakeCudart:
        def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:
            return 712

    cleared: list[bool] = []
    monkeypatch.setattr(torch.cuda, "cudart", lambda: FakeCudart())
    monkeypatch.setattr(shm, "clear_cuda_error", lambda: cleared.append(True) or 712)
    seg = shm.Segment(f"titan_morph_test_pin_{os.getpid()}", 64, 2, create=True)
    try:
        with pytest.raises(RuntimeError, match=r"cudaErrorHostMemoryAlreadyRegistered \(712\).*already page-locked"):
            seg.pin()
        assert cleared == [True]
        assert not seg._pinned
    finally:
        seg.close()
        seg.unlink()
