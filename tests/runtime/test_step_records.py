"""Per-step records of MorphSchedule that need no processes: plan numbers, message latencies."""

from __future__ import annotations

import pytest

from titan_morph.pipelining.schedule import StepRecord, message_latencies, plan_number


def test_plan_number_is_the_first_six_hex_digits_exact_in_float32():
    assert plan_number("b419b7250b06") == float(0xB419B7)
    assert plan_number("ffffff000000") == 16777215.0 < 2**24


def test_summary_carries_what_the_last_stage_needs():
    rec = StepRecord(4, "abc", 100.0, 90.0, compute_ms={"F": 30.0, "I": 30.0}, start_s=10.0, blocked_ms={0: 2.5})
    summ = rec.summary()
    assert summ["step"] == 4.0 and summ["end_s"] == pytest.approx(10.1)
    assert summ["idle_ms"] == 40.0 and summ["blocked_ms"] == 2.5


def test_latency_counts_only_messages_the_receiver_was_waiting_for():
    sender = {"sent": {"0/fwd/0": 100.0, "0/fwd/1": 200.0, "1/bwd/0": 50.0}}
    receiver = {
        "received": {
            "0/fwd/0": (90.0, 101.5),  # waiting since 90, due at 100, arrived 101.5: 1.5 ms latency
            "0/fwd/1": (250.0, 250.1),  # receiver came late (busy): not latency
            "1/bwd/0": (40.0, 50.5),  # 0.5 ms
            "2/fwd/0": (0.0, 1.0),  # no matching send record: ignored
        }
    }
    got = message_latencies([sender, receiver])
    assert got == {0: [pytest.approx(1.5)], 1: [pytest.approx(0.5)]}
