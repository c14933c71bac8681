"""A stage's TP lanes folded into the one row the monitor reads: the stage waits for its slowest
lane, per message and per op kind, and every rank folds the same rows into the same row."""

from __future__ import annotations

import math

import pytest

from titan_morph.monitor.lanes import slowest_lane, stages_of_lanes
from titan_morph.monitor.profile import MessageStamp, StepProfile


def _lane(arrive: float, compute_f: float, sent_at: float = 10.0, start: float = 0.0) -> StepProfile:
    send = MessageStamp("send", "torch", 0, "fwd", 0, sent_at, nbytes=100)
    recv = MessageStamp("recv", "torch", 0, "bwd", 0, arrive, arrive + 1, arrive + 2, 100)
    compute = {"F": (compute_f, 4), "I": (8.0, 4), "W": (6.0, 4)}
    return StepProfile(1, 5, start, start + 100.0, compute, [send, recv], plan=42, blocked_ms=1.0, sends=4)


def test_the_stage_row_is_its_slowest_lane_per_message_and_kind() -> None:
    fast, slow_link, slow_rank = _lane(20.0, 10.0), _lane(80.0, 10.0, start=1.0), _lane(21.0, 30.0, sent_at=12.0)
    row = slowest_lane([fast, slow_link, slow_rank])
    stamps = {m.side: m for m in row.messages}
    assert stamps["recv"].t1 == 80.0 and stamps["recv"].t3 == 82.0  # the link's slow lane: the stage waits for it
    assert stamps["send"].t1 == 12.0  # the stage's send is done when its last lane's is
    assert row.compute["F"] == (30.0, 4) and row.compute["I"] == (8.0, 4)  # the slow rank holds its stage
    assert (row.stage, row.step, row.plan, row.start_ms, row.end_ms) == (1, 5, 42, 0.0, 101.0)
    assert slowest_lane([fast]) is fast
    # the order of the lanes does not matter: every rank folds the same row
    again = slowest_lane([slow_rank, fast, slow_link])
    assert sorted(map(repr, again.messages)) == sorted(map(repr, row.messages)) and again.compute == row.compute


def test_an_unstamped_arrival_falls_back_to_the_waits_return() -> None:
    a = _lane(math.nan, 10.0)
    b = _lane(math.nan, 10.0)
    b.messages[1] = MessageStamp("recv", "torch", 0, "bwd", 0, math.nan, 5.0, 70.0, 100)
    row = slowest_lane([a, b])
    assert next(m for m in row.messages if m.side == "recv").t3 == 70.0


def test_rows_fold_stage_by_stage() -> None:
    rows = [_lane(20.0, 10.0), _lane(60.0, 10.0), _lane(20.0, 10.0), _lane(25.0, 10.0)]
    rows[2].stage = rows[3].stage = 2
    folded = stages_of_lanes(rows, 2)
    assert [p.stage for p in folded] == [1, 2]
    assert [max(m.t1 for m in p.messages if m.side == "recv") for p in folded] == [60.0, 25.0]
    with pytest.raises(ValueError, match="3 rows are not whole stages of 2 lane"):
        stages_of_lanes(rows[:3], 2)
