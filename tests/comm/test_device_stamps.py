"""Per-message link delays on a GPU run from when the sender's device had the payload (fakes, no GPU):
the stamps follow the device, never synchronise, and a busy sender queue is not read as a slow link."""

from __future__ import annotations

import threading
import time

import pytest

from titan_morph.comm.machine.devices import StreamMarks
from titan_morph.comm.machine.stamps import DeviceStamps
from titan_morph.comm.records import MessageRecord
from titan_morph.monitor.delays import estimate_links
from titan_morph.runtime.exchange import step_profile
from titan_morph.runtime.records import StepRecord


class FakeQueue:
    """A device queue: marks complete once ``done`` (the device's progress) passes them."""

    def __init__(self) -> None:
        self.tail, self.done = 0, 0

    def work(self) -> None:
        self.tail += 1


class FakeEvent:
    def __init__(self, queue: FakeQueue) -> None:
        self.queue, self.at = queue, None

    def record(self, stream=None) -> None:
        self.at = self.queue.tail

    def query(self) -> bool:
        return self.at <= self.queue.done

    def synchronize(self) -> None:
        raise AssertionError("stamping must never synchronise with the device")


def test_marks_are_stamped_when_the_device_passes_them_in_order() -> None:
    queue, now = FakeQueue(), [50.0]
    stamps = DeviceStamps(marks=StreamMarks(lambda: FakeEvent(queue), lambda: None, lambda: now[0]), poll_s=1e-4)
    try:
        queue.work()
        first = stamps.mark()
        queue.work()
        second = stamps.mark()
        time.sleep(0.05)
        assert first.t_s is None and second.t_s is None  # the device has not run the producing work yet
        now[0], queue.done = 51.0, 1
        deadline = time.monotonic() + 5
        while first.t_s is None and time.monotonic() < deadline:
            time.sleep(0.001)
        assert first.t_s == 51.0 and second.t_s is None
        now[0], queue.done = 52.5, 2
        while second.t_s is None and time.monotonic() < deadline:
            time.sleep(0.001)
        assert second.t_s == 52.5
    finally:
        stamps.close()
    assert not any(t.name == "titan_morph-ready-stamps" and t.is_alive() for t in threading.enumerate())


def _profiles(ready: float | None) -> list:
    """Link 0: stage 0 issues a send at 10 ms whose payload its busy device has only at 40 ms; the
    data is usable on stage 1 at 45 ms, where the consumer had been waiting since 5 ms."""
    send = MessageRecord("send", 0, "fwd", 0, 64, 1, 1, issued=10.0, accepted=10.0, ready=ready, path="torch")
    recv = MessageRecord("recv", 0, "fwd", 0, 64, 1, 0, issued=1.0, waited=5.0, completed=45.0, path="torch")
    rows = []
    for stage, msg in ((0, send), (1, recv)):
        rec = StepRecord(0, "00000000abcd", 60.0, None, start_s=0.0, messages=[msg])
        rows.append(step_profile(rec, stage, 0.0))
    return rows


def test_a_busy_sender_queue_is_not_read_as_link_delay() -> None:
    (host,) = estimate_links(_profiles(None), 2)
    (device,) = estimate_links(_profiles(40.0), 2)
    assert host.delay_ms == pytest.approx(35.0)  # from the host's call: the queue counted as the link
    assert device.delay_ms == pytest.approx(5.0)  # from the payload's readiness: the link alone
