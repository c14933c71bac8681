"""Alg. 3/4 generator: structure, warm-up/limit semantics, δ-quantisation, errors, speed sanity."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from titan_morph.pipelining.core.links import LinkDownError, StaticDelays
from titan_morph.pipelining.core.model import CostModel, Op, in_flight_peak, validate_orders, warmup_count
from titan_morph.pipelining.core.stragglers import TraceDelays, TraceEvent
from titan_morph.pipelining.reference.instances import instance_set
from titan_morph.pipelining.schedules.event_loop import ALL_POLICY_BITS, run_generator
from titan_morph.pipelining.schedules.generate import generate
from titan_morph.pipelining.timing.simulate import makespan


def _ops(text: str) -> tuple[Op, ...]:
    return tuple(Op.parse(t) for t in text.split())


def test_zb_h2_fig4_orders() -> None:
    """Paper Fig. 4: S=4, N=12, x = 7,5,3,1 -> last stage F/I alternate, W deferred to the end."""
    model = CostModel.uniform(4, 12, 10, 10, 10)
    orders = generate(model, (7, 5, 3, 1))
    validate_orders(model, orders)
    assert [warmup_count(o) for o in orders] == [7, 5, 3, 1]
    assert orders[3][:4] == _ops("F0 I0 F1 I1")
    assert orders[3][-12:] == tuple(Op("W", m) for m in range(12))
    assert orders[0][:9] == _ops("F0 F1 F2 F3 F4 F5 F6 I0 F7")


@pytest.mark.parametrize("split", [True, False])
def test_limit_bounds_in_flight(split: bool) -> None:
    model = CostModel.uniform(4, 16, 3, 5, 2, delays=[4, 0, 9])
    orders = generate(model, (4, 3, 2, 1), limit=(6, 5, 3, 1), split_backward=split)
    validate_orders(model, orders)
    for o, x, lim in zip(orders, (4, 3, 2, 1), (6, 5, 3, 1)):
        assert x <= warmup_count(o) <= lim  # a larger cap lets F (priority over W) run before the first I
        assert in_flight_peak(o) <= lim
    kinds = {op.kind for o in orders for op in o}
    assert kinds == ({"F", "I", "W"} if split else {"F", "B"})


def test_one_f_one_b_shape() -> None:
    """x_i = S - i with fused B and limit x_i is classic 1F1B: warm-up, then B/F alternation."""
    model = CostModel.uniform(4, 8, 1, 2, 0)
    orders = generate(model, (4, 3, 2, 1), split_backward=False)
    assert orders[0] == _ops("F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7")
    assert orders[3] == _ops("F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7")


def test_delta_quantisation_never_beats_exact() -> None:
    """A δ-quantised schedule (ops start on multiples of δ) is a feasible schedule: neither its own
    timeline nor its orders re-timed by the simulator may beat the optimum (CP-SAT, solved without
    the closed-form bound), and δ → 0 approaches the event-driven generator."""
    model = CostModel.uniform(4, 12, [7, 9, 8, 11], [13, 12, 14, 10], [5, 6, 4, 7], delays=[3, 17, 2])
    exact = makespan(model, generate(model, (7, 5, 3, 1)))
    fine = makespan(model, generate(model, (7, 5, 3, 1), delta=0.5))
    assert fine == pytest.approx(exact, rel=0.05)
    pytest.importorskip("ortools", reason="the optimum needs OR-Tools (dev dependency)")
    from titan_morph.pipelining.reference.exact import optimal_makespan

    checked = 0
    for model in instance_set(31, 5, s_range=(2, 3), n_mult=(1, 2), memory=None):
        opt = optimal_makespan(model, time_limit_s=20, use_bound=False)
        assert opt.optimal, opt.status
        x = tuple(min(model.microbatches, model.stages - s) for s in range(model.stages))
        lim = tuple(min(model.microbatches, model.stages - s + 1) for s in range(model.stages))
        for delta in (1.0, 3.0, 7.0, 20.0):
            for limit in (x, lim):
                coarse = generate(model, x, limit=limit, delta=delta)
                validate_orders(model, coarse)
                span, _ = run_generator(model, x, limit, (0,) * model.stages, delta=delta, record=False)
                assert span >= makespan(model, coarse) - 1e-9  # re-timing the orders only helps
                assert makespan(model, coarse) >= opt.makespan - 1e-9
                checked += 1
    assert checked == 5 * 4 * 2


def test_links_model_overrides_model_delays() -> None:
    model = CostModel.uniform(3, 6, 10, 10, 10)
    a = generate(model.with_delays([0, 25]), (5, 3, 1))
    b = generate(model, (5, 3, 1), links=StaticDelays((0.0, 25.0)))
    assert a == b


@pytest.mark.parametrize(
    ("warmup", "match"),
    [
        ((3, 5, 1), "Lemma 1"),
        ((3, 2), "needs 3 values"),
        ((13, 2, 1), r"1 <= x_i <= N = 12"),
        ((3, 2, 0), r"x_2 = 0 out of range"),
    ],
)
def test_bad_warmup(warmup: tuple[int, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        generate(CostModel.uniform(3, 12, 1, 1, 1), warmup)


def test_warmup_over_memory_budget() -> None:
    model = CostModel.uniform(3, 12, 1, 1, 1, memory=[4, 4, 4])
    with pytest.raises(ValueError, match=r"stage 0: warm-up of x_0 = 5 .* memory budget M_0 = 4"):
        generate(model, (5, 3, 1))


def test_bad_limit_and_delta() -> None:
    model = CostModel.uniform(3, 12, 1, 1, 1)
    with pytest.raises(ValueError, match="limit_1 = 1 out of range"):
        generate(model, (3, 2, 1), limit=(3, 1, 1))
    with pytest.raises(ValueError, match="delta"):
        generate(model, (3, 2, 1), delta=0)


def test_link_down_is_reported() -> None:
    model = CostModel.uniform(3, 4, 1, 1, 1, delays=[0, float("inf")])
    with pytest.raises(LinkDownError, match="link 1"):
        generate(model, (3, 2, 1))


def test_single_stage() -> None:
    model = CostModel.uniform(1, 3, 1, 1, 1)
    assert generate(model, (1,)) == (_ops("F0 I0 F1 I1 F2 I2 W0 W1 W2"),)


def test_refill_keeps_stages_ahead() -> None:
    """refill=True: below the limit an available F runs before an I (stage 0 alternates I/F)."""
    model = CostModel.uniform(4, 30, 10, 10, 10)
    plain = generate(model, (10, 7, 4, 1))
    refill = generate(model, (10, 7, 4, 1), refill=True)
    assert plain[0][10:13] == _ops("I0 I1 I2")  # the I burst after warm-up
    assert refill[0][10:14] == _ops("I0 F10 I1 F11")
    assert makespan(model, plain) == makespan(model, refill)


@st.composite
def _knobs(draw: st.DrawFn) -> tuple[CostModel, tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    s = draw(st.integers(1, 5))
    n = draw(st.integers(1, 10))
    times = [[float(draw(st.integers(0, 15))) for _ in range(s)] for _ in range(3)]
    delays = [float(draw(st.integers(0, 40))) for _ in range(s - 1)]
    memory = draw(st.none() | st.lists(st.integers(1, 2 * s + 1), min_size=s, max_size=s))
    model = CostModel(s, n, *times, tuple(delays), memory)  # type: ignore[arg-type]
    caps = []
    for k in range(s):
        caps.append(min([model.budget(k)] + caps[-1:]))
    x: list[int] = []
    for k in reversed(range(s)):
        lo = x[-1] if x else 1
        x.append(draw(st.integers(lo, max(lo, caps[k]))))
    x.reverse()
    limit = tuple(draw(st.integers(xi, model.budget(k))) for k, xi in enumerate(x))
    policy = tuple(draw(st.integers(0, ALL_POLICY_BITS)) for _ in range(s))
    return model, tuple(x), limit, policy


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_knobs(), split=st.booleans())
def test_generator_timeline_is_the_timing_routine(case, split: bool) -> None:
    """The generator's own makespan equals the timing routine's on the orders it emits, for every
    knob (warm-up, limit, policy bits): the search relies on it to score knobs without re-timing."""
    model, x, limit, policy = case
    span, codes = run_generator(model, x, limit, policy, split_backward=split)
    orders = generate(model, x, limit=limit, policy=policy, split_backward=split)
    validate_orders(model, orders)
    assert all(in_flight_peak(o) <= lim for o, lim in zip(orders, limit))
    assert span == pytest.approx(makespan(model, orders))
    assert run_generator(model, x, limit, policy, split_backward=split, record=False)[0] == span


def test_generator_under_time_varying_links_matches_the_timing_routine() -> None:
    model = CostModel.uniform(4, 10, [9, 11, 10, 12], [10, 12, 9, 11], [6, 8, 7, 9])
    trace = TraceDelays(
        3, (TraceEvent(0.0, 1, 25.0), TraceEvent(150.0, 1, 5.0), TraceEvent(80.0, 2, 40.0)), key="time_ms"
    )
    for t0 in (0.0, 100.0):
        span, _ = run_generator(model, (6, 5, 3, 1), (6, 5, 3, 1), (0, 1, 2, 4), links=trace, t0=t0)
        orders = generate(model, (6, 5, 3, 1), policy=(0, 1, 2, 4), links=trace, t0=t0)
        assert span == pytest.approx(makespan(model, orders, links=trace, t0=t0))


def test_bad_policy() -> None:
    model = CostModel.uniform(3, 4, 1, 1, 1)
    with pytest.raises(ValueError, match="policy_1 = 32 out of range"):
        generate(model, (3, 2, 1), policy=(0, 32, 0))
    with pytest.raises(ValueError, match="policy needs 1 or 3 values"):
        generate(model, (3, 2, 1), policy=(0, 1))
