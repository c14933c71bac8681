"""Delivery delays from gathered profiles: exact samples vs upper bounds, matching, row round trip."""

import math

import pytest

from titan_morph.monitor.delays import estimate_links, quantile
from titan_morph.monitor.profile import MessageStamp, StepProfile, capacity, decode, encode, row_width

NAN = float("nan")


def prof(stage, *msgs):
    return StepProfile(stage, 3, 0.0, 100.0, {"F": (30.0, 3), "I": (30.0, 3), "W": (30.0, 3)}, list(msgs))


def send(link, seq, accepted, path="emulated", d="fwd"):
    return MessageStamp("send", path, link, d, seq, accepted)


def recv(link, seq, arrived=NAN, waited=NAN, returned=NAN, path="emulated", d="fwd"):
    return MessageStamp("recv", path, link, d, seq, arrived, waited, returned)


def test_transport_stamped_arrival_is_exact_even_when_consumer_is_late():
    profiles = [prof(0, send(0, 5, 10.0)), prof(1, recv(0, 5, arrived=70.0, waited=300.0, returned=300.1))]
    (e,) = estimate_links(profiles, 2)
    assert e.exact == [60.0] and e.bounds == [] and e.delay_ms == 60.0


def test_consumer_side_samples_exact_when_blocked_bound_when_not():
    profiles = [
        prof(0, send(0, 0, 10.0), send(0, 1, 20.0), send(0, 2, 30.0)),
        prof(
            1,
            recv(0, 0, waited=5.0, returned=41.0),  # waiting before acceptance: exact 31
            recv(0, 1, waited=40.0, returned=52.0),  # blocked 12 ms: exact 32
            recv(0, 2, waited=90.0, returned=90.2),  # returned at once: the data was there, <= 60.2
        ),
    ]
    (e,) = estimate_links(profiles, 2)
    assert sorted(e.exact) == [31.0, 32.0]
    assert e.bounds == pytest.approx([60.2])
    assert e.upper_ms == 31.5


def test_matching_uses_path_and_direction():
    profiles = [
        prof(0, send(0, 0, 10.0, path="emulated"), send(0, 0, 12.0, path="delegate")),
        prof(1, recv(0, 0, arrived=15.0, path="delegate"), recv(0, 0, arrived=11.0, d="bwd")),
    ]
    (e,) = estimate_links(profiles, 2)
    assert e.exact == [3.0]  # the bwd receive has no matching send in this step


def test_row_round_trip():
    p = prof(
        1,
        MessageStamp("send", "emulated", 1, "bwd", 7, 1.5, nbytes=4096),
        recv(0, 3, arrived=2.5, waited=1.0, returned=3.0, path="delegate"),
    )
    row = encode(p, microbatches=4)
    assert len(row) == row_width(4)
    q = decode(row)
    assert (q.stage, q.step, q.compute) == (1, 3, p.compute)
    assert [(m.side, m.path, m.link, m.direction, m.seq, m.t1) for m in q.messages] == [
        (m.side, m.path, m.link, m.direction, m.seq, m.t1) for m in p.messages
    ]
    assert math.isnan(q.messages[0].t2) and q.messages[1].t3 == 3.0
    assert [m.nbytes for m in q.messages] == [4096, 0]  # sizes travel for the bandwidth estimate (0 = unknown)


def test_row_overflow_drops_extra_messages_instead_of_failing():
    p = prof(0, *[send(0, i, 1.0) for i in range(capacity(2) + 3)])
    q = decode(encode(p, microbatches=2))
    assert len(q.messages) == capacity(2) and p.dropped == 3
    assert [m.seq for m in q.messages] == list(range(capacity(2)))


def test_quantile():
    assert quantile([1, 2, 3, 4], 0.5) == 2.5 and quantile([5], 0.75) == 5
    with pytest.raises(ValueError):
        quantile([], 0.5)
