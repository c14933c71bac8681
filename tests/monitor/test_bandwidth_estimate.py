"""Latency and bandwidth from per-message timings, checked against the planner's own FIFO wire
(``pipelining.core.links.LinkQueue``) under known latency and rate, and against delay-only links."""

import math
import random
import statistics

import pytest

from titan_morph.monitor.bandwidth import WireTiming, estimate_wire, mbps
from titan_morph.pipelining.core.links import LinkModel, LinkQueue
from titan_morph.pipelining.core.stragglers import RandomDelays


class SizedLink(LinkModel):
    """One link: constant latency, transmit time = the next message's size / ``mbit``."""

    def __init__(self, latency_ms: float, mbit: float) -> None:
        self.num_links, self.latency_ms, self.mbit, self.nbytes = 1, latency_ms, mbit, 0

    def delay_ms(self, link, direction, t_ms=0.0, step=0):
        return self.latency_ms

    def transmit_ms(self, link, direction, t_ms=0.0, step=0):
        return self.nbytes * 8 / (self.mbit * 1e3) if self.mbit else 0.0


def sends(rng: random.Random, n: int, period_ms: float) -> list[float]:
    """Send times with bursts (back to back, as in a warm-up) and pauses (a compute period)."""
    t, out = 0.0, []
    for _ in range(n):
        t += rng.choice([0.0, 0.3, rng.expovariate(1 / period_ms)])
        out.append(t)
    return out


def wire(model: LinkModel, times, sizes, rng, jitter_ms=0.3, depth=None) -> list[WireTiming]:
    """The timings a receiver would stamp: LinkQueue's delivery plus host jitter."""
    queue = LinkQueue(model, 0, "fwd", depth)
    out = []
    for seq, (t, size) in enumerate(zip(times, sizes, strict=True)):
        if isinstance(model, SizedLink):
            model.nbytes = size
        got = queue.send(t)
        out.append(WireTiming(seq, got.accepted, got.delivered + rng.uniform(0, jitter_ms), size))
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    ("latency_ms", "mbit", "sizes"),
    [
        (10.0, 1000.0, (1_000_000,)),  # 8 ms per message
        (2.0, 400.0, (500_000,)),  # transmit dominates: 10 ms
        (30.0, 2000.0, (2_000_000, 1_000_000)),  # two sizes on one link: 8 and 4 ms
        (5.0, 100.0, (64_000, 128_000)),  # small messages on a slow link: 5 and 10 ms
        (0.0, 800.0, (1_000_000,)),  # bandwidth only
    ],
)
def test_recovers_latency_and_rate_of_a_fifo_wire(seed, latency_ms, mbit, sizes):
    rng = random.Random(seed)
    times = sends(rng, 16, period_ms=15.0)
    msgs = wire(SizedLink(latency_ms, mbit), times, [rng.choice(sizes) for _ in times], rng)
    got = estimate_wire(msgs, floor_ms=1.0)
    assert got.identified and got.queued >= 2, got
    assert got.bandwidth_mbps == pytest.approx(mbit, rel=0.03)
    assert got.latency_ms == pytest.approx(latency_ms, abs=0.5)  # jitter is 0..0.3 ms
    typical = statistics.median(m.nbytes for m in msgs)  # the transmit time is a median message's
    assert got.transmit_ms == pytest.approx(typical * 8 / (mbit * 1e3), rel=0.03)
    # Eq. 1 samples: every non-queued message's cost is latency + its own transmit, no queue wait
    assert len(got.costs_ms) == len(msgs) - got.queued
    most = max(sizes) * 8 / (mbit * 1e3)
    assert max(got.costs_ms) <= latency_ms + most + 1.0


def test_queue_waits_are_left_out_of_the_costs():
    rng = random.Random(1)
    msgs = wire(SizedLink(5.0, 1000.0), [0.0] * 8, [1_000_000] * 8, rng, jitter_ms=0.0)  # one burst of 8
    got = estimate_wire(msgs)
    assert got.queued == 7 and got.queued_seqs == tuple(range(1, 8))
    assert got.costs_ms == pytest.approx([13.0]) and got.latency_ms == pytest.approx(5.0)
    assert got.bandwidth_mbps == pytest.approx(1000.0)


@pytest.mark.parametrize("seed", range(4))
def test_constant_delay_only_link_has_no_rate_to_report(seed):
    rng = random.Random(seed)
    times = sends(rng, 16, period_ms=15.0)
    msgs = wire(SizedLink(20.0, 0.0), times, [1_000_000] * 16, rng)
    got = estimate_wire(msgs)
    assert not got.identified and got.bandwidth_mbps is None and got.transmit_ms is None
    assert got.latency_ms == pytest.approx(20.0, abs=0.3)  # the delay-only reading
    assert got.costs_ms and len(got.costs_ms) == 16
    assert got.bandwidth_floor_mbps == pytest.approx(mbps(1_000_000, max(got.costs_ms[i] for i in range(16))), rel=0.1)


def test_wandering_delays_are_not_mistaken_for_a_rate():
    invented = []
    for seed in range(120):
        rng = random.Random(seed)
        model = RandomDelays(
            1, rng.choice([5.0, 20.0, 40.0]), rng.choice([2.0, 10.0]), (rng.choice([20, 100]), 200), seed
        )
        times = sends(rng, 16, period_ms=15.0)
        got = estimate_wire(wire(model, times, [1_000_000] * 16, rng, jitter_ms=0.5, depth=rng.choice([None, 2])))
        if got.identified:
            invented.append((seed, got.bandwidth_mbps))
    assert invented == []


def test_a_delay_only_link_with_a_bounded_queue_has_no_rate():
    """A depth-limited transport (NCCL-like) delivers d messages per latency: its senders block
    before acceptance, not on a wire, so arrivals bunch without any message queueing on the link."""
    invented = []
    for seed in range(150):
        rng = random.Random(seed)
        latency, depth = rng.choice([20.0, 40.0, 60.0]), rng.choice([1, 2, 3])
        times = [10.0 * k for k in range(rng.choice([4, 8, 12]))] + [200.0 + 30.0 * k for k in range(8)]
        msgs = wire(SizedLink(latency, 0.0), times, [262_144] * len(times), rng, jitter_ms=2.0, depth=depth)
        got = estimate_wire(msgs)
        if got.identified:
            invented.append((seed, got.transmit_ms))
    assert invented == []


def test_one_late_arrival_stamp_does_not_hide_the_rate():
    rng = random.Random(5)
    times = [0.0, 0.2, 0.4, 0.6] + [40.0 + 30.0 * k for k in range(4)]  # a warm-up burst of 4, then spaced
    msgs = wire(SizedLink(0.5, 125.0), times, [262_144] * 8, rng)  # 16.8 ms per message
    late = [m if m.seq != 2 else WireTiming(m.seq, m.sent, m.arrived + 10.0, m.nbytes) for m in msgs]  # host hiccup
    got = estimate_wire(late)
    assert got.identified and got.bandwidth_mbps == pytest.approx(125.0, rel=0.03)


def test_a_rate_limited_link_that_never_queued_gives_only_a_lower_bound():
    rng = random.Random(3)
    times = [20.0 * k for k in range(8)]  # one message every 20 ms, each on the wire for 8 ms
    got = estimate_wire(wire(SizedLink(4.0, 1000.0), times, [1_000_000] * 8, rng))
    assert not got.identified and got.bandwidth_mbps is None
    assert got.latency_ms == pytest.approx(12.0, abs=0.3)  # latency + transmit: what Eq. 1 needs
    assert got.bandwidth_floor_mbps is not None and got.bandwidth_floor_mbps <= 1000.0


def test_unknown_arrivals_and_sizes():
    rng = random.Random(0)
    msgs = wire(SizedLink(5.0, 1000.0), [0.0] * 8, [1_000_000] * 8, rng, jitter_ms=0.0)
    unsized = [WireTiming(m.seq, m.sent, m.arrived) for m in msgs]
    got = estimate_wire(unsized)  # no sizes: a transmit time per message, no rate
    assert got.transmit_ms == pytest.approx(8.0) and got.bandwidth_mbps is None and got.bandwidth_floor_mbps is None
    gappy = [m if m.seq % 2 else WireTiming(m.seq, m.sent, math.nan, m.nbytes) for m in msgs]
    got = estimate_wire(gappy)  # no message has a known predecessor: nothing to measure a gap from
    assert got.messages == 4 and not got.identified
    assert estimate_wire([]).messages == 0 and estimate_wire([]).latency_ms is None
    with pytest.raises(ValueError, match="floor_ms"):
        estimate_wire(msgs, floor_ms=-1.0)
