"""Bandwidth in the monitor: queued messages leave the delay samples for the transmit time, the
detector judges latency (Eq. 1) and the wire's pace, and re-planning gets both (Alg. 2 + the search
under the bandwidth model); the figures name them."""

from __future__ import annotations

import random

import pytest

from titan_morph.monitor.adapt import AdaptPolicy, Monitor
from titan_morph.monitor.bandwidth import WireEstimate
from titan_morph.monitor.delays import LinkEstimate, estimate_links
from titan_morph.monitor.detect import Detector, DetectRule
from titan_morph.monitor.profile import MessageStamp, StepProfile
from titan_morph.monitor.replan import wire_capacity_ms
from titan_morph.pipelining.core.links import LinkQueue, StaticDelays
from titan_morph.pipelining.core.model import CostModel
from titan_morph.pipelining.search.builders import build

S, N, T = 4, 12, 10.0
SIZE = 1_000_000  # bytes per message: 8 ms at 1000 Mbit/s


def _sends(step: int) -> list[float]:
    """A warm-up burst of 4 forwards, then one per 3T (the steady state's F + I + W)."""
    base = 1000.0 * step
    return [base + 0.2 * k for k in range(4)] + [base + 3 * T * (k - 3) for k in range(4, N)]


def _profiles(step: int, latency: tuple[float, ...], transmit: tuple[float, ...], seed: int = 0) -> list[StepProfile]:
    """One step of S stages: compute F/I/W of T ms, and N forward messages per link through the
    planner's FIFO wire with the given latencies and transmit times (arrivals stamped, ~0.3 ms jitter)."""
    rng = random.Random(seed * 1000 + step)
    links = StaticDelays(latency, transmit=transmit)
    out = [StepProfile(s, step, 1000.0 * step, 1000.0 * step + 900.0, {k: (T * N, N) for k in "FIW"}) for s in range(S)]
    for link in range(S - 1):
        queue = LinkQueue(links, link, "fwd")
        for seq, t in enumerate(_sends(step)):
            got = queue.send(t)
            key = ("emulated", link, "fwd", step * N + seq)
            out[link].messages.append(MessageStamp("send", *key, got.accepted, nbytes=SIZE))
            arrived = got.delivered + rng.uniform(0.0, 0.3)
            out[link + 1].messages.append(MessageStamp("recv", *key, arrived, nbytes=SIZE))
    return out


def test_estimates_separate_queueing_latency_and_rate_per_link():
    (healthy, slow, delay_only) = estimate_links(_profiles(1, (1.0, 5.0, 20.0), (0.0, 8.0, 0.0)), S)
    assert slow.bandwidth_mbps == pytest.approx(1000.0, rel=0.03)
    assert slow.transmit_ms == pytest.approx(8.0, rel=0.03)
    assert slow.latency_ms == pytest.approx(5.0, abs=0.4)
    assert slow.exact and max(slow.exact) < 5.0 + 8.0 + 1.0  # the burst's queue waits are not delays
    assert slow.delay_ms == pytest.approx(13.0, abs=0.4)  # a message's Eq. 1 cost: latency + transmit
    assert slow.wires[("emulated", "fwd")].queued == 4  # the burst, and the next one (the wire is busy until 32 ms)
    for est, delay in ((healthy, 1.0), (delay_only, 20.0)):
        assert est.bandwidth_mbps is None and est.transmit_ms is None and est.latency_ms is None
        assert est.delay_ms == pytest.approx(delay, abs=0.4) and len(est.exact) == N


def _est(link: int, cost: float, transmit: float | None) -> LinkEstimate:
    est = LinkEstimate(link, exact=[cost - 0.2, cost, cost + 0.2])
    if transmit is not None:  # the estimate's wire: as estimate_links fills it
        est.wires[("emulated", "fwd")] = WireEstimate(N, 3, cost - transmit, transmit, SIZE * 8 / (transmit * 1e3))
    return est


def test_a_wire_slower_than_the_pipeline_is_congested_though_eq1_absorbs_its_delay():
    det = Detector(2, DetectRule(detect_steps=2, recover_steps=2))
    tol, cap = [100.0, 100.0], [30.0, 30.0]  # Eq. 1 absorbs 100 ms; one message per 30 ms period
    quiet = [_est(0, 12.0, 8.0), _est(1, 12.0, None)]
    assert det.update(1, quiet, tol, tol, cap) is None
    assert det.update(2, quiet, tol, tol, cap) is None
    congested = [_est(0, 12.0, 8.0), _est(1, 46.0, 40.0)]  # 40 ms on the wire > 30 ms + 10 %
    assert det.update(3, congested, tol, tol, cap) is None  # k = 2
    d = det.update(4, congested, tol, tol, cap)
    assert d is not None and d.newly_slow == (1,)
    assert d.transmit_ms == (0.0, 40.0) and d.delays_ms == (0.0, 10.0)  # p75 46.1 - 40 rounded up to 5
    assert "transmit 40.0 ms per message > 30.0 ms the plan absorbs" in d.reasons[0]
    # the same estimates without capacities: Eq. 1 alone sees nothing (delay 46 < 110)
    plain = Detector(2, DetectRule(detect_steps=2))
    assert all(plain.update(s, congested, tol, tol) is None for s in range(1, 6))
    # a faster wire re-plans as "worse" only when it grows: here it recovers once the wire keeps pace
    fast = [_est(0, 12.0, 8.0), _est(1, 12.0, 8.0)]  # 8 ms <= recover_ratio x 30 ms, delay 12 < 50
    assert det.update(5, fast, tol, tol, cap) is None
    d = det.update(6, fast, tol, tol, cap)
    assert d is not None and d.recovered == (1,) and d.transmit_ms == () and d.delays_ms == (0.0, 0.0)


def test_a_growing_transmit_time_replans_worse():
    det = Detector(1, DetectRule(detect_steps=1, recover_steps=3))
    tol, cap = [100.0], [30.0]
    d = det.update(1, [_est(0, 45.0, 40.0)], tol, tol, cap)
    assert d is not None and d.transmit_ms == (40.0,)
    d = det.update(2, [_est(0, 65.0, 60.0)], tol, tol, cap)
    assert d is not None and d.newly_slow == () and d.transmit_ms == (60.0,) and "link 0 worse" in d.reasons[0]
    assert det.update(3, [_est(0, 65.0, 60.0)], tol, tol, cap) is None  # the plan already covers it


def test_wire_capacity_is_the_busiest_ranks_period_per_hop():
    assert wire_capacity_ms(CostModel.uniform(4, 8, 10.0, 12.0, 8.0)) == (30.0, 30.0, 30.0)
    v = CostModel.uniform(8, 8, 10.0, 10.0, 10.0, stages_per_rank=2)  # the V: two hops per link
    assert wire_capacity_ms(v) == (30.0, 30.0, 30.0)


def _monitor() -> Monitor:
    initial = build("pipemorph", CostModel.uniform(S, N, T, T, T, memory=S))
    return Monitor(
        num_stages=S,
        microbatches=N,
        initial_plan=initial,
        fallback_times=((T, T, T),) * S,
        rule=DetectRule(detect_steps=2, recover_steps=2),
        policy=AdaptPolicy(search=True, search_iterations=50),
    )


def test_monitor_replans_with_measured_transmit_times_and_reports_them():
    latency, transmit = (0.0, 0.0, 20.0), (0.0, 0.0, 35.0)  # link 2: 20 ms + a wire slower than the 30 ms period
    runs = []
    for _rank in range(2):  # every rank feeds the same rows: the same decision
        mon, change, active = _monitor(), None, None
        for step in range(1, 4):
            change = mon.observe(step, _profiles(step, latency, transmit, seed=0), mon.initial_plan) or change
        assert change is not None
        active = change.plan
        runs.append((change, active, mon))
    (change, plan, mon), (again, plan2, _) = runs
    assert plan.plan_id == plan2.plan_id and change.transmit_ms == again.transmit_ms
    assert change.transmit_ms[2] == pytest.approx(35.0, abs=1.0) and change.transmit_ms[:2] == (0.0, 0.0)
    assert plan.model.transmit == change.transmit_ms  # Alg. 2 + the search planned under the bandwidth model
    assert plan.model.delays[2] == pytest.approx(20.0, abs=5.0)
    assert plan.model.delays[2] + plan.model.transmit[2] >= 55.0  # their sum covers the measured cost
    assert "transmit" in change.describe(plan, mon.times.times(), [])
    figures = mon.metrics(frozenset())
    assert figures["morph/bandwidth_mbps/link2"] == pytest.approx(SIZE * 8 / 35e3, rel=0.03)
    assert figures["morph/transmit_ms/link2"] == pytest.approx(35.0, rel=0.03)
    assert figures["morph/link_latency_ms/link2"] == pytest.approx(20.0, abs=0.5)
    assert figures["morph/delay_ms/link2"] == pytest.approx(55.0, abs=0.5)
    assert figures["morph/planned_transmit_ms/link2"] == change.transmit_ms[2]
    assert "morph/bandwidth_mbps/link0" not in figures  # no message queued there: no rate to report
    assert figures["morph/delay_ms/link0"] < 1.0
