"""The testbed's device clock (titan_morph.runtime.testbed): when an op's padded time starts."""

from __future__ import annotations

import time

import pytest

from titan_morph.runtime import testbed
from titan_morph.runtime.testbed import DeviceClock, InputWait, StageTimes


@pytest.fixture
def clock(monkeypatch):
    monkeypatch.setattr(testbed, "_last_wait", InputWait(-1.0, -1.0))
    c = DeviceClock(hide_host_gap_ms=2.0)
    c.device_end, c.host_end = 10.000, 10.0003  # previous op: device end 10 s, returned 0.3 ms later
    return c


def test_host_overhead_is_hidden_under_the_previous_op(clock):
    assert clock.start(10.0015) == 10.000  # 1.5 ms after it returned: the device ran on


def test_long_host_gap_is_device_idle(clock):
    assert clock.start(10.0100) == 10.0100  # 9.7 ms later (> 2 ms): the device idled


def test_blocked_input_wait_starts_the_op_at_the_arrival(clock, monkeypatch):
    monkeypatch.setattr(testbed, "_last_wait", InputWait(10.0004, 10.0060))  # waited 5.6 ms for the input
    assert clock.start(10.0061) == 10.0060


def test_short_wait_counts_as_host_overhead(clock, monkeypatch):
    monkeypatch.setattr(testbed, "_last_wait", InputWait(10.0004, 10.00045))  # 0.05 ms: the input was there
    assert clock.start(10.0006) == 10.000


def test_at_most_the_hide_gap_is_hidden(clock):
    clock.host_end = 10.0050  # the previous op woke up 5 ms late (heavy load) and the host came back at once
    assert clock.start(10.0055) == pytest.approx(10.0035)  # hidden: 2 ms, not 5.5


def test_stale_wait_from_before_the_previous_op_is_ignored(clock, monkeypatch):
    monkeypatch.setattr(testbed, "_last_wait", InputWait(9.0, 9.9))
    assert clock.start(10.0005) == 10.000


def test_never_starts_before_the_previous_device_end(clock, monkeypatch):
    monkeypatch.setattr(testbed, "_last_wait", InputWait(10.0003, 10.0008))  # a blocked wait ...
    clock.device_end = 10.0009  # ... that ended before the device was free: the op waits for the device
    assert clock.start(10.0010) == 10.0009


def test_run_pads_to_target_and_slow_compute_extends_the_device_time(monkeypatch):
    monkeypatch.setattr(testbed, "_last_wait", InputWait(-1.0, -1.0))
    c = DeviceClock(hide_host_gap_ms=0.0)
    t0 = time.monotonic()
    c.run(0.005, lambda: None)
    assert time.monotonic() - t0 >= 0.005 and c.device_end == pytest.approx(t0 + 0.005, abs=0.05)
    t1 = time.monotonic()
    c.run(0.001, time.sleep, 0.004)  # real compute (4 ms) longer than the target (1 ms)
    assert c.device_end >= t1 + 0.004


def test_bad_settings_name_the_value():
    with pytest.raises(ValueError, match="hide_host_gap_ms"):
        DeviceClock(hide_host_gap_ms=-1)
    with pytest.raises(ValueError, match="fwd_ms"):
        StageTimes(-1, 1, 1)


def test_blocked_wait_starts_the_op_at_the_link_models_delivery(clock, monkeypatch):
    # waited 5.6 ms; the link model delivered at 10.0050 and the host saw it 1 ms later (emulator latency)
    monkeypatch.setattr(testbed, "_last_wait", InputWait(10.0004, 10.0060, 10.0050))
    assert clock.start(10.0061) == pytest.approx(10.0050)


def test_delivery_hides_at_most_the_host_gap(clock, monkeypatch):
    monkeypatch.setattr(testbed, "_last_wait", InputWait(10.0004, 10.0100, 10.0050))  # seen 5 ms after its delivery
    assert clock.start(10.0101) == pytest.approx(10.0081)  # only 2 ms of that is hidden


class _Rec:
    side = "recv"


class _Handle:
    """A receive handle as the transports' Handle protocol describes it."""

    ops = ()

    def __init__(self, due_s):
        self.record, self.due_s = _Rec(), due_s

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True


def test_due_of_a_wait_is_its_latest_delivery_or_the_wait_end():
    assert testbed._due([_Handle(1.0), _Handle(2.0)], 3.0) == 2.0
    assert testbed._due([_Handle(1.0), _Handle(None)], 3.0) == 3.0  # one delivery unknown: the wait's end
    assert testbed._due([_Handle(4.0)], 3.0) == 3.0  # never after the data was seen
    assert testbed._due([object()], 3.0) == 3.0  # no emulated receive (torch's own works)
