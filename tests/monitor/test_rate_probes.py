"""Rate probes in the monitor: when a link's rate is asked for, what a probe's stamps give, how long
the result is held, and the link model built from them (per direction: latency and transmit time)."""

from __future__ import annotations

import pytest

from titan_morph.monitor.adapt import Monitor, host_gaps_ms
from titan_morph.monitor.delays import LinkEstimate, estimate_links
from titan_morph.monitor.detect import LinkState
from titan_morph.monitor.profile import PROBE_PATH, MessageStamp, StepProfile
from titan_morph.monitor.rate_probes import RateProbes
from titan_morph.pipelining.core.links import StaticDelays
from titan_morph.pipelining.core.model import CostModel
from titan_morph.pipelining.search.builders import build
from titan_morph.pipelining.timing.simulate import simulate

SIZE = 64 * 1024
TAU = 27.0  # ms per message: 19.4 Mbit/s


def _spaced(step: int, cost: dict[str, float], n: int = 6) -> list[StepProfile]:
    """One step on two stages: ``n`` messages each way on link 0, spaced 100 ms apart (none queues),
    each arriving ``cost[direction]`` after it was accepted; the receiver was already waiting."""
    out = [StepProfile(s, step, 0.0, 1000.0) for s in range(2)]
    for direction, (src, dst) in (("fwd", (0, 1)), ("bwd", (1, 0))):
        for seq in range(n):
            key = ("torch", 0, direction, seq)
            t = 100.0 * seq + (50.0 if direction == "bwd" else 0.0)
            out[src].messages.append(MessageStamp("send", *key, t, nbytes=SIZE))
            out[dst].messages.append(MessageStamp("recv", *key, float("nan"), t - 1.0, t + cost[direction], SIZE))
    return out


def _probe(profiles: list[StepProfile], latency: float = 1.0, tau: float = TAU) -> list[StepProfile]:
    """A train of three each way after the step: handed over together, arriving one ``tau`` apart."""
    for direction, (src, dst), t0 in (("fwd", (0, 1), 2000.0), ("bwd", (1, 0), 2200.0)):
        for k in range(3):
            key = (PROBE_PATH, 0, direction, k)
            arrived = t0 + latency + tau * (k + 1)
            waited = t0 - 0.5 if k == 0 else t0 + latency + tau * k
            profiles[src].messages.append(MessageStamp("send", *key, t0, nbytes=SIZE))
            profiles[dst].messages.append(MessageStamp("recv", *key, float("nan"), waited, arrived, SIZE))
    return profiles


def test_spaced_messages_give_no_rate_and_a_congested_link_asks_for_a_probe() -> None:
    (est,) = estimate_links(_spaced(1, {"fwd": 28.0, "bwd": 48.0}), 2)
    assert est.transmit_ms is None and est.bandwidth_mbps is None  # idle messages: latency + tau, inseparable
    book = RateProbes(1, every_steps=5)
    book.take(1, [est])
    assert book.due(1, [est], [LinkState(over=1)], 50.0) == (0,)
    assert book.due(1, [est], [LinkState()], 5.0) == (0,)  # its delays are above the floor
    assert book.due(1, [est], [LinkState()], 50.0) == ()  # a healthy link is not probed


def test_a_probe_gives_the_rate_and_each_directions_latency_and_is_held() -> None:
    book = RateProbes(1, every_steps=5)
    (est,) = estimate_links(_probe(_spaced(2, {"fwd": 28.0, "bwd": 48.0})), 2)
    assert est.exact and all(x in (28.0, 48.0) for x in est.exact)  # the train's costs are not delays
    book.take(2, [est])
    assert est.probed is not None and est.measured_by_probe
    assert est.transmit_ms == pytest.approx(TAU, rel=0.01)
    assert est.bandwidth_mbps == pytest.approx(SIZE * 8 / (TAU * 1e3), rel=0.01)
    wire = est.direction_wire_ms()
    assert wire["fwd"] == pytest.approx((1.0, TAU), abs=0.05)
    assert wire["bwd"] == pytest.approx((21.0, TAU), abs=0.05)  # the reverse traffic's share, as latency
    assert est.latency_ms == pytest.approx(21.0, abs=0.05)
    congested = [LinkState(over=1)]
    # the next steps have no train: the held rate stands, and no probe is due until every_steps passed
    for step in (3, 6):
        (later,) = estimate_links(_spaced(step, {"fwd": 28.0, "bwd": 48.0}), 2)
        book.take(step, [later])
        assert later.transmit_ms == pytest.approx(TAU, rel=0.01)
        assert book.due(step, [later], congested, 50.0) == ()
    (late,) = estimate_links(_spaced(7, {"fwd": 28.0, "bwd": 48.0}), 2)
    book.take(7, [late])
    assert book.due(7, [late], congested, 50.0) == (0,)


def test_a_message_faster_than_the_held_rate_asks_again_and_a_healthy_link_forgets() -> None:
    book = RateProbes(1, every_steps=50)
    (est,) = estimate_links(_probe(_spaced(1, {"fwd": 28.0, "bwd": 28.0})), 2)
    book.take(1, [est])
    (faster,) = estimate_links(_spaced(2, {"fwd": 14.0, "bwd": 14.0}), 2)  # the rate doubled
    book.take(2, [faster])
    assert book.due(2, [faster], [LinkState(slow=True)], 50.0) == (0,)
    book.settle([faster], [LinkState(slow=True)], 50.0)
    assert book.held != [None]  # still wanted
    book.settle([faster], [LinkState()], 50.0)
    (after,) = estimate_links(_spaced(3, {"fwd": 28.0, "bwd": 28.0}), 2)
    book.take(3, [after])
    assert after.probed is None and after.transmit_ms is None


def test_a_train_that_was_there_before_its_waits_measures_nothing() -> None:
    profiles = _spaced(1, {"fwd": 28.0, "bwd": 28.0})
    for k in range(3):  # a delay-only link: all three arrive together, each wait returns at once
        key = (PROBE_PATH, 0, "fwd", k)
        profiles[0].messages.append(MessageStamp("send", *key, 2000.0, nbytes=SIZE))
        profiles[1].messages.append(
            MessageStamp("recv", *key, float("nan"), 2100.0 + k * 0.01, 2100.0 + k * 0.01 + 0.005, SIZE)
        )
    (est,) = estimate_links(profiles, 2)
    book = RateProbes(1)
    book.take(1, [est])
    assert est.transmit_ms is None and book.held == [None]
    assert est.bounds == [] and sorted(set(est.exact)) == [28.0]  # nor a delay sample of the pipeline


def test_a_link_whose_tail_queues_asks_for_a_probe_below_the_floor() -> None:
    """A rate limit the pace absorbs shows in the messages sent back to back (the end of a step),
    long before it moves the median: those are wanted; one host hiccup among them is not."""
    book = RateProbes(1)
    queued = LinkEstimate(0, exact=[8.5] * 17 + [19.0, 33.0, 44.0])  # the last three queued behind each other
    hiccup = LinkEstimate(0, exact=[1.5] * 19 + [40.0])
    assert queued.delay_ms is not None and queued.delay_ms < 10.0
    assert book.due(1, [queued], [LinkState()], 10.0) == (0,)
    assert book.due(1, [hiccup], [LinkState()], 10.0) == ()


def test_a_probe_that_measured_no_rate_is_tried_again_ever_more_rarely() -> None:
    book = RateProbes(1, every_steps=20)
    congested, due_at, last = [LinkState(over=1)], [], None
    for step in range(1, 60):
        profiles = _spaced(step, {"fwd": 28.0, "bwd": 28.0})
        if last == step - 1:  # the train runs between steps and is seen in the next exchange
            # no rate until step 36's train: a latency-only train (all three arrive together)
            profiles = _probe(profiles, latency=30.0, tau=TAU if step >= 36 else 0.0)
        (est,) = estimate_links(profiles, 2)
        book.take(step, [est])
        if book.due(step, [est], congested, 50.0) == (0,):
            due_at.append(step)
            last = step
    # trains seen at steps 2, 5, 10 and 19 measured nothing: tried again 2, 4, 8 and 16 steps later;
    # the one seen at step 36 measured the rate, held for every_steps
    assert due_at == [1, 4, 9, 18, 35, 56], due_at
    assert book.held[0] is not None and book.misses == [0]


def test_the_monitors_link_model_is_the_simulator_under_its_estimates() -> None:
    model = CostModel.uniform(2, 6, 10.0, 10.0, 10.0)
    plan = build("zbh2", model)
    monitor = Monitor(num_stages=2, microbatches=6, initial_plan=plan, fallback_times=((10.0, 10.0, 10.0),) * 2)
    profiles = _probe(_spaced(1, {"fwd": 28.0, "bwd": 48.0}))
    for prof in profiles:
        prof.compute = {k: (10.0 * 6, 6) for k in "FIW"}
    monitor.observe(1, profiles, plan)
    links = monitor.estimated_links()
    assert links.fwd == pytest.approx((1.0,), abs=0.05) and links.bwd == pytest.approx((21.0,), abs=0.05)
    assert links.static_transmit[0] == pytest.approx((TAU,), rel=0.01)
    floor = monitor.floor_links()  # for a bound: the least latency, the wire's own rate
    assert floor.fwd == floor.bwd == pytest.approx((1.0,), abs=0.05)
    assert floor.static_transmit[0] == floor.static_transmit[1] == pytest.approx((TAU,), rel=0.01)
    gaps = host_gaps_ms(profiles)
    assert gaps[0] > 0 and gaps[1] > 0
    timed = CostModel.uniform(
        2, 6, tuple(10.0 + g for g in gaps), tuple(10.0 + g for g in gaps), tuple(10.0 + g for g in gaps)
    )
    expected = simulate(timed, plan.orders, links=links, depth=None).makespan
    assert monitor.modelled_ms(plan, None) == pytest.approx(expected)
    flat = simulate(timed, plan.orders, links=StaticDelays((0.0,)), depth=None).makespan
    assert expected > flat  # the slow link costs something


def test_host_gaps_are_the_step_less_ops_waits_and_blocked_sends_per_op() -> None:
    prof = StepProfile(0, 1, 100.0, 300.0, {"F": (60.0, 4), "I": (40.0, 4), "W": (20.0, 2)}, blocked_ms=10.0)
    for seq, (waited, returned) in enumerate(((110.0, 130.0), (120.0, 140.0), (200.0, 205.0))):  # union: 35 ms
        prof.messages.append(MessageStamp("recv", "torch", 0, "bwd", seq, float("nan"), waited, returned, 8))
    prof.messages.append(MessageStamp("recv", PROBE_PATH, 0, "bwd", 0, float("nan"), 150.0, 190.0, 8))  # not the step's
    assert host_gaps_ms([prof, StepProfile(1, 1, 0.0, 10.0)]) == pytest.approx([(200 - 120 - 35 - 10) / 10, 0.0])


def test_a_held_rate_tells_a_bursts_queue_from_latency_where_its_gaps_give_no_rate() -> None:
    """A burst whose arrival gaps wander (the reverse direction's traffic in between) measures no rate
    itself; at the probe's rate its waits behind one another are still queueing, not delay."""
    out = [StepProfile(s, 1, 0.0, 1000.0) for s in range(2)]
    arrivals = [30.0, 57.0, 102.0, 132.0, 192.0, 219.0]  # gaps 27, 45, 30, 60, 27: no rate in them
    for seq, arrived in enumerate(arrivals):
        key = ("delegate", 0, "fwd", seq)
        out[0].messages.append(MessageStamp("send", *key, 0.0, nbytes=SIZE))
        out[1].messages.append(MessageStamp("recv", *key, arrived, nbytes=SIZE))
    (alone,) = estimate_links(out, 2)
    assert alone.transmit_ms is None and alone.delay_ms == pytest.approx(117.0)  # every wait read as delay
    (known,) = estimate_links(out, 2, per_byte_ms=[TAU / SIZE])
    wire = known.wires[("delegate", "fwd")]
    assert wire.assumed_rate and wire.queued_seqs == (1, 2, 3, 4, 5)
    assert known.delay_ms == pytest.approx(30.0)
    assert wire.transmit_ms == pytest.approx(TAU)  # the wire's rate stands (the probe's)
    assert wire.loaded_transmit_ms == pytest.approx(37.8)  # what the queue met: the mean gap
    assert known.direction_wire_ms()["fwd"] == pytest.approx((0.0, 37.8))  # the link model's
    book = RateProbes(1)
    book.take(1, [known])
    assert book.due(1, [known], [LinkState(slow=True)], 5.0) == (0,)  # an assumed rate is no measurement


def test_a_queue_slower_than_the_probes_rate_is_the_wire_loaded_and_still_probed() -> None:
    """The pipeline's own messages queued back to back and arrived 30 ms apart: a rate, but the wire
    loaded (the other direction's traffic, the protocol's round trips), so a probe is still asked
    for; at the probe's 27 ms the link reads the probe's rate and plans with the 30 ms it met."""
    out = [StepProfile(s, 1, 0.0, 1000.0) for s in range(2)]
    for seq in range(6):
        key = ("torch", 0, "fwd", seq)
        out[0].messages.append(MessageStamp("send", *key, 0.0, nbytes=SIZE))
        out[1].messages.append(MessageStamp("recv", *key, float("nan"), 0.0, 1.0 + 30.0 * (seq + 1), SIZE))
    (alone,) = estimate_links(out, 2)
    assert alone.transmit_ms == pytest.approx(30.0)  # the gaps alone give the loaded rate
    book = RateProbes(1)
    book.take(1, [alone])
    assert book.due(1, [alone], [LinkState(slow=True)], 5.0) == (0,)  # measured by the pipeline: still probed
    (known,) = estimate_links(out, 2, per_byte_ms=[TAU / SIZE])
    wire = known.wires[("torch", "fwd")]
    assert wire.assumed_rate and wire.transmit_ms == pytest.approx(TAU)
    assert wire.loaded_transmit_ms == pytest.approx(30.0)
    assert known.bandwidth_mbps == pytest.approx(SIZE * 8 / (TAU * 1e3))
