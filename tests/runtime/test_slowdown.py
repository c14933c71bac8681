"""Emulated compute stragglers on a stage: the real model's extra time and the testbed's pads follow
the rank's factor in the current step (the clocks are faked: the amounts are checked, not timed)."""

from __future__ import annotations

import pytest

from titan_morph.pipelining.core.speeds import StaticFactors, WindowedFactors
from titan_morph.runtime import slowdown, testbed
from titan_morph.runtime.slowdown import ComputeSlowdown, slow_stage_compute
from titan_morph.runtime.testbed import StageTimes, pad_stage_compute


class _Stage:
    stage_index = 3
    device = None

    def __init__(self, clock: list[float], took_s: float) -> None:
        self.clock, self.took_s, self.calls = clock, took_s, []

    def forward_one_chunk(self, mb: int) -> str:
        self.clock[0] += self.took_s
        self.calls.append(("F", mb))
        return f"out{mb}"

    def backward_one_chunk(self, mb: int, full_backward: bool = True) -> None:
        self.clock[0] += self.took_s
        self.calls.append(("B" if full_backward else "I", mb))

    def backward_weight_one_chunk(self, mb: int) -> None:
        self.clock[0] += self.took_s
        self.calls.append(("W", mb))


def test_a_real_op_is_followed_by_factor_minus_one_times_its_duration(monkeypatch):
    clock, slept = [100.0], []
    monkeypatch.setattr(slowdown.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(slowdown.time, "sleep", slept.append)
    slow = ComputeSlowdown()
    slow.configure(WindowedFactors(StaticFactors((1.0, 1.0, 1.0, 3.0)), start_step=2), rank=3)
    stage = _Stage(clock, took_s=0.004)
    slow_stage_compute(stage, slow)
    assert stage.forward_one_chunk(0) == "out0" and slept == []  # step 1: factor 1
    slow.set_step(2)
    stage.forward_one_chunk(1)
    stage.backward_one_chunk(1, full_backward=False)
    stage.backward_weight_one_chunk(1)
    assert slept == pytest.approx([0.008] * 3) and stage.calls == [("F", 0), ("F", 1), ("I", 1), ("W", 1)]
    with pytest.raises(RuntimeError, match="already slowed"):
        slow_stage_compute(stage, slow)


def test_the_testbed_pads_to_the_configured_time_times_the_factor(monkeypatch):
    clock = [50.0]
    monkeypatch.setattr(testbed.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(testbed, "_sleep_until", lambda deadline: None)
    factor = [1.0]
    stage = _Stage(clock, took_s=0.0001)
    device = pad_stage_compute(stage, StageTimes(10.0, 20.0, 5.0), factor=lambda: factor[0])
    spans = []
    for f in (1.0, 2.0):
        factor[0] = f
        for call in (lambda: stage.forward_one_chunk(0), lambda: stage.backward_one_chunk(0, full_backward=False)):
            call()
            spans.append(round((device.device_end - device.last_begin) * 1e3, 6))
            clock[0] = device.device_end + 1.0  # the next op is called after a long host gap
    assert spans == [10.0, 20.0, 20.0, 40.0]
