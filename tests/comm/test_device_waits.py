"""Waits on NCCL that never hold the host, on fakes (no GPU; NCCL's two-rank paths cannot run on one
GPU either): the device watch lands and stalls operations off the host, and ``auto``'s replay after
a failed link re-posts a receive that never ran, discards one that ran, and refuses to replay one
handed to the device that had not run (its consumer is queued behind it)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from titan_morph.comm.failover.resend import Recv, Resender
from titan_morph.comm.transport import DeviceOrdered
from titan_morph.comm.waits import DeviceOp, DeviceWatch


class Work:
    """A ``dist.Work`` on the device's queue: complete once ``done`` is set."""

    def __init__(self, done: bool = False) -> None:
        self.done, self.waits = done, 0

    def is_completed(self) -> bool:
        return self.done

    def wait(self) -> bool:
        self.waits += 1
        return True


def test_the_watch_lands_what_completes_and_reports_what_outlasts_its_bound_once() -> None:
    now = [10.0]
    watch = DeviceWatch(thread=False, clock=lambda: now[0])
    fast, slow = DeviceOp(Work()), DeviceOp(Work())
    stalls: list[float] = []
    watch.watch(fast, 1.0, stalls.append)
    watch.watch(slow, 1.0, stalls.append)
    now[0] = 10.5
    fast.work.done = True  # type: ignore[attr-defined]
    assert watch.poll() == 1 and fast.landed() is True and fast.landed_at == 10.5 and slow.landed() is None
    now[0] = 11.25
    assert watch.poll() == 0 and stalls == [1.25] and slow.landed() is False
    assert watch.poll() == 0 and stalls == [1.25]


def test_the_watch_thread_stamps_a_landing_while_the_host_goes_on() -> None:
    watch = DeviceWatch()
    op = DeviceOp(Work())
    landed = threading.Event()
    op.when_landed(lambda t: landed.set())
    watch.watch(op, 60.0, lambda s: pytest.fail("stalled"))
    time.sleep(0.01)
    assert not landed.is_set()
    op.work.done = True  # type: ignore[attr-defined]
    assert landed.wait(5.0) and watch.pending() == 0


class OnDevice:
    """A default-path handle on NCCL: its wait returned at once; the device ran it or not."""

    record = None
    due_s = None

    def __init__(self, landed: bool | None) -> None:
        self.op = DeviceOp(Work())
        self.op.landed_at = 1.0 if landed else None
        self.op.stalled_s = 2.0 if landed is False else None
        self.ops = ()

    def wait(self, timeout: float | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def device_ops(self) -> list[DeviceOp]:
        return [self.op]


def test_auto_replays_on_the_delegates_only_what_it_can(monkeypatch) -> None:
    monkeypatch.setattr(dist, "P2POp", lambda op, tensor, peer, group: SimpleNamespace(op=op, tensor=tensor))
    assert isinstance(OnDevice(True), DeviceOrdered)
    posted: list[list] = []
    delegates = SimpleNamespace(batch_p2p=lambda ops: posted.append(ops) or [SimpleNamespace(record=None)])
    router = SimpleNamespace(
        lock=threading.RLock(), fatal={}, where=lambda: "stage 1 (rank 1)", transport=lambda path: delegates
    )
    resender = Resender(router, SimpleNamespace(posted=lambda *a: 0))  # type: ignore[arg-type]
    key = (0, "fwd")
    recvs = []
    for landed, waited in ((True, True), (None, True), (None, False)):
        r = Recv(resender, key, 5, [SimpleNamespace(tensor=torch.zeros(2), group_peer=0, group=None)])  # type: ignore[list-item]
        r.carry([OnDevice(landed)], "default", 0)  # type: ignore[list-item]
        r.done = waited  # a stream-ordered wait returned: its consumer is queued on the device
        resender.keep(r)
        recvs.append(r)
    resender.replay(key, False, 5, "delegate", 1)
    ran, lost, unwaited = recvs
    assert [d[0] for d in resender._discards[key]] == [ran, lost]  # each takes its re-sent copy
    assert unwaited.path == "delegate" and posted[-1] == unwaited.ops  # posted again, into its own buffer
    err = router.fatal[0]
    assert "receive of step 5 on link 0 (fwd) from stage 0 was handed to the device" in str(err)
    assert "cannot be replayed" in str(err)
