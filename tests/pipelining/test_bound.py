"""The lower bound under time-varying links (timing.bounds.lower_bound_under): valid for every plan the
builders make, under static, random and traced delays, and exact where it can be worked by hand."""

from __future__ import annotations

import math

import pytest

from titan_morph.pipelining.core.links import StaticDelays, WithTransmit
from titan_morph.pipelining.core.model import CostModel
from titan_morph.pipelining.core.stragglers import RandomDelays, TraceDelays, TraceEvent
from titan_morph.pipelining.reference.instances import instance_set
from titan_morph.pipelining.search.builders import SCHEDULES, V_SCHEDULES, build
from titan_morph.pipelining.timing.bounds import lower_bound_ms, lower_bound_under
from titan_morph.pipelining.timing.simulate import simulate


def _uniform(stages: int, n: int, stages_per_rank: int = 1) -> CostModel:
    return CostModel(stages, n, (10.0,) * stages, (10.0,) * stages, (10.0,) * stages, stages_per_rank=stages_per_rank)


def test_static_links_give_the_first_forward_plus_the_last_ranks_work() -> None:
    model = _uniform(4, 24)
    # (F + c) on each of the 3 hops, then 24 x (F + I + W) on the last rank
    assert lower_bound_under(model, StaticDelays((30.0, 30.0, 30.0))) == pytest.approx(3 * 40 + 720)
    assert lower_bound_under(model, StaticDelays((0.0, 0.0, 60.0))) == pytest.approx(30 + 60 + 720)
    # the closed form (static delays, no memory cap) agrees on these
    assert lower_bound_ms(model.with_delays((30.0, 30.0, 30.0))) == pytest.approx(840)
    # the bound is relative to the step's start: a static link gives the same at any t0
    assert lower_bound_under(model, StaticDelays((30.0, 30.0, 30.0)), t0=12345.6) == pytest.approx(840)


def test_a_delay_that_drops_lets_a_later_send_arrive_first() -> None:
    """Link 0 takes 50 ms until t = 25 ms, then nothing: a forward ready at 10 ms is best sent at 25
    (arrives 25), not at once (arrives 60). The grid may place the drop up to one step early."""
    model = _uniform(2, 1)
    trace = TraceDelays(1, (TraceEvent(0.0, 0, 50.0), TraceEvent(25.0, 0, 0.0)), key="time_ms")
    bound = lower_bound_under(model, trace, resolution_ms=0.5)
    assert 25 + 30 - 0.5 <= bound <= 25 + 30
    assert bound < 60 + 30  # what the delay at the ready time alone would give (invalid)
    # the eager schedule: F arrives at 60, stage 1's F and B end at 90, stage 0's B at 110
    eager = simulate(model, build("1f1b", model).orders, links=trace).makespan
    assert eager == pytest.approx(110) and eager >= bound


def test_a_link_that_is_down_has_no_finite_bound() -> None:
    model = _uniform(3, 4)
    assert math.isinf(lower_bound_under(model, StaticDelays((0.0, math.inf))))


def test_bad_inputs_are_named() -> None:
    model = _uniform(3, 4)
    with pytest.raises(ValueError, match="resolution_ms must be > 0"):
        lower_bound_under(model, StaticDelays((0.0, 0.0)), resolution_ms=0)
    with pytest.raises(ValueError, match="links model has 3 links, the cost model 2"):
        lower_bound_under(model, StaticDelays((0.0, 0.0, 0.0)))


@pytest.mark.parametrize("interval", [(5.0, 20.0), (100.0, 200.0)])
def test_no_plan_beats_the_bound_under_random_delays(interval: tuple[float, float]) -> None:
    """Every builder's plan, with and without the search, on random instances and at many step
    starts: the simulated makespan never falls below the bound (delays change faster than a step)."""
    checked = 0
    for k, model in enumerate(instance_set(97, 6, s_range=(2, 5), n_mult=(1, 3), memory="mixed")):
        links = RandomDelays(model.num_links, 25.0, 15.0, interval, seed=k)
        plans = []
        for name in SCHEDULES:
            try:
                plans.append(build(name, model))
            except ValueError:  # the schedule's warm-up does not fit the memory budget
                continue
        plans.append(build("pipemorph", model.with_delays((25.0,) * model.num_links), search=True, iterations=50))
        for t0 in (0.0, 137.0, 1010.5, 4321.0):
            bound = lower_bound_under(model, links, t0=t0)
            for plan in plans:
                span = simulate(plan.model.with_delays((0.0,) * model.num_links), plan.orders, links=links, t0=t0)
                assert span.makespan >= bound - 1e-9, (plan.schedule, t0, span.makespan, bound)
                checked += 1
    assert checked > 100


def test_no_v_plan_beats_the_bound() -> None:
    model = _uniform(8, 12, stages_per_rank=2)
    links = RandomDelays(model.num_links, 20.0, 10.0, (10.0, 40.0), seed=3)
    for name in V_SCHEDULES:
        plan = build(name, model)
        for t0 in (0.0, 500.0, 2222.0):
            bound = lower_bound_under(model, links, t0=t0)
            span = simulate(plan.model.with_delays((0.0,) * model.num_links), plan.orders, links=links, t0=t0).makespan
            assert span >= bound - 1e-9, (name, t0)
    # the V's rank 0 runs the first and the last stage: its work starts at once
    assert lower_bound_under(model, StaticDelays((0.0,) * model.num_links)) >= 12 * 60


def test_bandwidth_counts_each_messages_transmit_and_each_wires_load() -> None:
    """A 30 ms transmit time on the last link: the first forward crosses it in c + tau, and the
    link carries 24 messages per direction, so no step is shorter than 24 x 30 ms plus the work
    around the first and the last message; no builder's plan beats it, and the wire-load part is
    what makes it tight (the per-rank part alone is the 750 ms of the hop)."""
    model = _uniform(4, 24)
    links = StaticDelays((0.0, 0.0, 5.0), transmit=(0.0, 0.0, 30.0))
    hop_only = 30 + 5 + 30 + 720
    bound = lower_bound_under(model, links)
    assert bound > hop_only
    assert bound >= 24 * 30
    assert bound == pytest.approx(lower_bound_ms(model.with_delays((0.0, 0.0, 5.0)).with_transmit((0.0, 0.0, 30.0))))
    for name in SCHEDULES:
        plan = build(name, model)
        span = simulate(plan.model.with_delays((0.0,) * 3), plan.orders, links=links).makespan
        assert span >= bound - 1e-9, name
    # a model that may vary over time (here: any latency model plus transmit) gives no load
    # bound, only each message's own c + tau
    varying = WithTransmit(StaticDelays((0.0, 0.0, 5.0)), (0.0, 0.0, 30.0))
    assert lower_bound_under(model, varying) == pytest.approx(hop_only)
