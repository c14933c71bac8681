"""Per-step records, the exchange row and the figures made from it (no processes needed)."""

from __future__ import annotations

import pytest

from titan_morph.comm.records import MessageRecord
from titan_morph.monitor.profile import MessageStamp, StepProfile, decode, encode
from titan_morph.runtime.exchange import plan_number, step_profile
from titan_morph.runtime.metrics import message_latencies, pipeline_metrics, plan_scalar
from titan_morph.runtime.records import StepRecord

NAN = float("nan")


def test_plan_scalar_is_the_first_six_hex_digits_exact_in_float32():
    assert plan_scalar("b419b7250b06") == float(0xB419B7)
    assert plan_scalar("ffffff000000") == 16777215.0 < 2**24


def test_plan_number_survives_the_float64_row():
    prof = StepProfile(1, 4, 0.0, 1.0, {}, plan=plan_number("ffffffffffff"))
    assert decode(encode(prof, 4)).plan == 0xFFFFFFFFFFFF


def test_step_profile_puts_the_record_on_the_common_clock():
    epoch = 100.0
    send = MessageRecord("send", 0, "fwd", 3, 64, 5, 1, issued=9.0, accepted=10.0, planned=70.0, path="emulated")
    recv = MessageRecord("recv", 0, "bwd", 2, 64, 5, 1, issued=1.0, arrived=80.0, waited=75.0, completed=81.0)
    down = MessageRecord("send", 0, "fwd", 4, 64, 5, 1, issued=20.0, status="down")
    rec = StepRecord(
        4,
        "00000000abcd",
        100.0,
        90.0,
        compute_ms={"F": 30.0, "I": 30.0},
        op_ms=[("F", 0, 0.0, 15.0), ("F", 1, 20.0, 35.0), ("I", 0, 40.0, 70.0)],
        start_s=100.5,
        blocked_ms={0: 2.5},
        send_late_ms=[0.5, 1.5],
        failovers=1,
        messages=[send, recv, down],
    )
    prof = decode(encode(step_profile(rec, 0, epoch), 8))
    assert (prof.stage, prof.step, prof.plan) == (0, 4, 0xABCD)
    assert prof.start_ms == pytest.approx(500.0) and prof.end_ms == pytest.approx(600.0)
    assert prof.compute == {"F": (30.0, 2), "I": (30.0, 1)}
    assert (prof.blocked_ms, prof.send_late_ms, prof.sends, prof.failovers) == (2.5, 2.0, 2, 1)
    assert [m.key for m in prof.messages] == [("emulated", 0, "fwd", 3), ("", 0, "bwd", 2)]  # refused one left out
    assert (prof.messages[0].t1, prof.messages[0].t2) == (10.0, 70.0)
    assert (prof.messages[1].t1, prof.messages[1].t2, prof.messages[1].t3) == (80.0, 75.0, 81.0)


def test_latency_counts_only_messages_the_receiver_was_waiting_for():
    sender = StepProfile(
        0,
        1,
        0.0,
        300.0,
        {},
        [
            MessageStamp("send", "emulated", 0, "fwd", 0, 99.0, 100.0),
            MessageStamp("send", "emulated", 0, "fwd", 1, 199.0, 200.0),
            MessageStamp("send", "emulated", 1, "bwd", 0, 49.0, 50.0),
            MessageStamp("send", "torch", 1, "fwd", 0, 49.0),  # no planned delivery: not emulated
        ],
    )
    receiver = StepProfile(
        1,
        1,
        0.0,
        300.0,
        {},
        [
            MessageStamp("recv", "emulated", 0, "fwd", 0, NAN, 90.0, 101.5),  # waiting since 90: 1.5 ms
            MessageStamp("recv", "emulated", 0, "fwd", 1, NAN, 250.0, 250.1),  # came late (busy): not latency
            MessageStamp("recv", "emulated", 1, "bwd", 0, NAN, 40.0, 50.5),  # 0.5 ms
            MessageStamp("recv", "emulated", 2, "fwd", 0, NAN, 0.0, 1.0),  # no matching send: ignored
            MessageStamp("recv", "torch", 1, "fwd", 0, NAN, 0.0, 60.0),  # no planned delivery: ignored
        ],
    )
    got = message_latencies([sender, receiver])
    assert got == {0: [pytest.approx(1.5)], 1: [pytest.approx(0.5)]}


def test_pipeline_figures_from_all_stages():
    rows = [
        StepProfile(0, 1, 10.0, 110.0, {"F": (40.0, 4)}, blocked_ms=3.0, failovers=1),
        StepProfile(1, 1, 5.0, 130.0, {"F": (60.0, 4)}, send_late_ms=4.0, sends=2, failovers=1),
    ]
    out = pipeline_metrics(rows, 2)
    assert out["morph/pipeline_ms"] == 120.0  # stage 0's start to the latest end
    assert out["morph/bubble_rate"] == pytest.approx(1 - 100.0 / 240.0)
    assert out["morph/stage0/idle_ms"] == 60.0 and out["morph/stage1/idle_ms"] == 65.0
    assert out["morph/stage0/blocked_ms"] == 3.0 and out["morph/failovers"] == 2.0
    assert out["morph/send_latency_ms"] == 2.0
    assert "morph/pipeline_ms" not in pipeline_metrics(rows[1:], 2)  # a stage missing: no pipeline time
