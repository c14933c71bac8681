"""Property tests (hypothesis) of the generator and simulator on random pipelines.

Every generated order: holds each op once and fits the memory budget (``validate_orders``),
keeps Lemma 1 (warm-up counts non-increasing), respects every dependency when simulated, and
never deadlocks — also when executed under *different* random delays and blocking links.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from titan_morph.pipelining.core.links import StaticDelays
from titan_morph.pipelining.core.model import CostModel, Op, in_flight_peak, validate_orders, warmup_count
from titan_morph.pipelining.core.stragglers import RandomDelays
from titan_morph.pipelining.schedules.generate import generate
from titan_morph.pipelining.schedules.slackness import adapted_warmup, initial_warmup
from titan_morph.pipelining.search.builders import SCHEDULES, build
from titan_morph.pipelining.timing.simulate import SimResult, makespan, simulate

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def models(draw: st.DrawFn) -> CostModel:
    s = draw(st.integers(1, 6))
    n = draw(st.integers(1, 14))

    def per_stage(lo: int) -> list[float]:
        return [float(draw(st.integers(lo, 20))) for _ in range(s)]

    delays = [float(draw(st.integers(0, 60))) for _ in range(s - 1)]
    memory = draw(st.none() | st.lists(st.integers(1, 2 * s + 2), min_size=s, max_size=s))
    return CostModel(s, n, tuple(per_stage(1)), tuple(per_stage(0)), tuple(per_stage(0)), tuple(delays), memory)


@st.composite
def warmups(draw: st.DrawFn, model: CostModel) -> tuple[int, ...]:
    """A random x satisfying Lemma 1 and the budget: x_i <= min_{j<=i} budget_j."""
    caps = []
    for s in range(model.stages):
        caps.append(min([model.budget(s)] + caps[-1:]))
    x: list[int] = []
    for s in reversed(range(model.stages)):
        lo = x[-1] if x else 1
        x.append(draw(st.integers(lo, max(lo, caps[s]))))
    x.reverse()
    return tuple(x)


def check_dependencies(result: SimResult, fwd: list[float], bwd: list[float]) -> None:
    """Every op starts after its stage's previous op and its inputs (plus the link's min delay)."""
    model = result.model
    end = {(t.stage, t.op): t.end for ts in result.timings for t in ts}
    last = model.stages - 1
    for ts in result.timings:
        for prev, cur in zip(ts, ts[1:]):
            assert cur.start >= prev.end + prev.blocked - 1e-9
        for t in ts:
            assert t.start >= t.ready - 1e-9
            assert t.end == pytest.approx(t.start + model.duration(t.stage, t.op.kind))
            s, op = t.stage, t.op
            if op.kind == "F" and s > 0:
                assert t.start >= end[(s - 1, op)] + fwd[s - 1] - 1e-9
            if op.kind in ("I", "B"):
                assert t.start >= end[(s, Op("F", op.mb))] - 1e-9
                if s < last:
                    src = (s + 1, op) if (s + 1, op) in end else (s + 1, Op("B" if op.kind == "I" else "I", op.mb))
                    assert t.start >= end[src] + bwd[s] - 1e-9
            if op.kind == "W":
                assert t.start >= end[(s, Op("I", op.mb))] - 1e-9


@SETTINGS
@given(data=st.data())
def test_generated_orders_are_valid_and_never_deadlock(data: st.DataObject) -> None:
    model = data.draw(models())
    x = data.draw(warmups(model))
    split = data.draw(st.booleans())
    orders = generate(model, x, split_backward=split, refill=data.draw(st.booleans()))
    validate_orders(model, orders)  # each op exactly once, I after F, W after I, memory budget
    counts = [warmup_count(o) for o in orders]
    assert counts == list(x)
    assert all(a >= b for a, b in zip(counts, counts[1:]))  # Lemma 1
    assert all(in_flight_peak(o) <= xi for o, xi in zip(orders, x))

    # Execute under the planned delays and under different ones, blocking or not.
    planned = simulate(model, orders)
    check_dependencies(planned, list(model.delays), list(model.delays))
    assert makespan(model, orders) == pytest.approx(planned.makespan)
    links = model.stages - 1
    other_f = [float(data.draw(st.integers(0, 80))) for _ in range(links)]
    other_b = [float(data.draw(st.integers(0, 80))) for _ in range(links)]
    depth = data.draw(st.sampled_from([None, 1, 2, 3]))
    result = simulate(model, orders, links=StaticDelays(tuple(other_f), tuple(other_b)), depth=depth)
    check_dependencies(result, other_f, other_b)
    assert result.makespan == pytest.approx(
        makespan(model, orders, links=StaticDelays(tuple(other_f), tuple(other_b)), depth=depth)
    )
    assert result.critical_path[0].end == pytest.approx(result.makespan)
    assert all(0.0 <= b <= 1.0 for b in result.bubble_rate)
    if links:
        noisy = RandomDelays(links, mean=20.0, std=15.0, interval=(5.0, 40.0), seed=data.draw(st.integers(0, 99)))
        simulate(model, orders, links=noisy, depth=data.draw(st.sampled_from([None, 1, 2])))


@SETTINGS
@given(data=st.data())
def test_larger_in_flight_limits_stay_feasible(data: st.DataObject) -> None:
    model = data.draw(models())
    x = data.draw(warmups(model))
    limit = [data.draw(st.integers(xi, model.budget(s))) for s, xi in enumerate(x)]
    delta = data.draw(st.none() | st.sampled_from([0.5, 3.0, 7.0]))
    orders = generate(model, x, limit=limit, delta=delta, refill=data.draw(st.booleans()))
    validate_orders(model, orders)
    assert all(in_flight_peak(o) <= lim for o, lim in zip(orders, limit))
    assert all(warmup_count(o) >= xi for o, xi in zip(orders, x))
    simulate(model, orders, depth=data.draw(st.sampled_from([None, 1, 3])))


@SETTINGS
@given(model=models())
def test_planners_respect_lemma1_and_memory(model: CostModel) -> None:
    memory = model.memory if model.memory is not None else model.microbatches
    for x in (initial_warmup(model.stages, model.microbatches, memory), adapted_warmup(model)):
        assert len(x) == model.stages and x[-1] == 1
        assert all(a >= b for a, b in zip(x, x[1:]))
        assert all(1 <= xi <= model.budget(s) for s, xi in enumerate(x))
    for schedule in SCHEDULES:
        try:
            plan = build(schedule, model)
        except ValueError as exc:  # only a warm-up over the memory budget may refuse
            assert "memory budget" in str(exc)
            continue
        validate_orders(model, plan.orders)
        simulate(model, plan.orders, depth=1)
