"""Exact CP-SAT reference (reference/exact.py): it must agree with the simulator and bound every builder."""

from __future__ import annotations

import sys

import pytest

from titan_morph.pipelining.core.model import CostModel, Op, in_flight_peak, validate_orders
from titan_morph.pipelining.reference.instances import instance_set
from titan_morph.pipelining.search.builders import SCHEDULES, build
from titan_morph.pipelining.timing.simulate import simulate

pytest.importorskip("ortools", reason="reference/exact.py needs OR-Tools (dev dependency)")

from titan_morph.pipelining.reference.exact import optimal_makespan  # noqa: E402

TINY = instance_set(4242, 6, s_range=(2, 3), n_mult=(1, 2), memory="mixed")


@pytest.mark.parametrize("idx", range(len(TINY)))
def test_exact_reproduced_by_simulator_and_bounds_every_builder(idx: int) -> None:
    model = TINY[idx]
    res = optimal_makespan(model, time_limit_s=20)
    assert res.optimal, f"tiny instance not solved to optimality: {res}"
    assert res.lower_bound == pytest.approx(res.makespan)
    validate_orders(model, res.orders)  # each op once, F<I<W, memory budget
    for s, order in enumerate(res.orders):
        assert in_flight_peak(order) <= model.budget(s)
    sim = simulate(model, res.orders)
    assert sim.makespan == pytest.approx(res.makespan)
    for name in SCHEDULES:
        try:
            plan = build(name, model)
        except ValueError:  # e.g. the schedule's warm-up needs more than the memory budget
            continue
        assert res.makespan <= simulate(model, plan.orders).makespan + 1e-6, name


def test_exact_matches_hand_computed_optima() -> None:
    # One stage: everything is serial.
    one = CostModel.uniform(1, 3, 2.0, 3.0, 4.0)
    assert optimal_makespan(one, time_limit_s=10).makespan == pytest.approx(3 * 9.0)
    # One microbatch over two stages: F0 c F1 I1 c I0 W0 (W1 runs in parallel with the return).
    two = CostModel.uniform(2, 1, (1.0, 2.0), (3.0, 4.0), (5.0, 6.0), delays=10.0)
    res = optimal_makespan(two, time_limit_s=10)
    assert res.optimal
    assert res.makespan == pytest.approx(1 + 10 + 2 + 4 + 10 + 3 + 5)
    assert res.orders[1] == (Op("F", 0), Op("I", 0), Op("W", 0))


def test_fifo_restriction_agrees_with_full_model_on_tiny_instances() -> None:
    # Empirical support for the FIFO-first strategy (the module docstring explains why it is not
    # assumed): on these instances the FIFO optimum equals the unrestricted optimum.
    for model in instance_set(99, 4, s_range=(2, 3), n_mult=(1, 2), memory="tight"):
        full = optimal_makespan(model, time_limit_s=20, fifo=False)
        fifo = optimal_makespan(model, time_limit_s=20, fifo=True)
        assert full.optimal and fifo.optimal
        assert fifo.makespan == pytest.approx(full.makespan)


def test_off_grid_times_are_rounded_down_and_retimed() -> None:
    model = CostModel.uniform(2, 2, 1 / 3, 0.7071, 0.5, delays=0.1234567)
    res = optimal_makespan(model, time_limit_s=10)
    assert res.rounded and res.scale == 1000
    assert res.makespan == pytest.approx(simulate(model, res.orders).makespan)
    assert res.lower_bound <= res.makespan + 1e-9


def test_bad_inputs_raise_clear_errors() -> None:
    model = CostModel.uniform(2, 2, 1.0, 1.0, 1.0, delays=float("inf"))
    with pytest.raises(ValueError, match="link down"):
        optimal_makespan(model)
    with pytest.raises(ValueError, match="time_limit_s"):
        optimal_makespan(CostModel.uniform(2, 2, 1.0, 1.0, 1.0), time_limit_s=0)


def test_missing_ortools_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ortools.sat.python", None)
    monkeypatch.setitem(sys.modules, "ortools.sat.python.cp_model", None)
    with pytest.raises(ImportError, match="pip install ortools"):
        optimal_makespan(CostModel.uniform(2, 2, 1.0, 1.0, 1.0))


def test_closed_form_lower_bound_is_valid_and_used() -> None:
    """The bound is checked against optima solved WITHOUT it as a constraint (with it, any bound
    would pass); solved with it, the optimum is the same (the constraint cuts off no schedule)."""
    from titan_morph.pipelining.timing.bounds import lower_bound_ms

    for model in instance_set(5150, 6, s_range=(2, 3), n_mult=(1, 2), memory="tight"):
        free = optimal_makespan(model, time_limit_s=20, use_bound=False)
        assert free.optimal
        assert lower_bound_ms(model) <= free.makespan + 1e-9
        bounded = optimal_makespan(model, time_limit_s=20)
        assert bounded.optimal, bounded.status
        assert bounded.makespan == pytest.approx(free.makespan)
    # Memory waves: M = 1 on the last stage serialises F, I there: N (F + I) plus the way in/out,
    # which is the optimum.
    wave = CostModel.uniform(2, 3, 1.0, 2.0, 0.5, delays=4.0, memory=(3, 1))
    waves = 3 * (1.0 + 2.0) + (1.0 + 4.0) + (4.0 + 2.0 + 0.5)
    assert lower_bound_ms(wave) >= waves
    free = optimal_makespan(wave, time_limit_s=10, use_bound=False)
    assert free.optimal
    assert free.makespan == pytest.approx(waves)
    assert lower_bound_ms(wave) <= free.makespan + 1e-9


def test_out_of_time_falls_back_to_the_hint_never_claiming_optimality() -> None:
    model = instance_set(5, 1)[0]
    res = optimal_makespan(model, time_limit_s=0.001)  # warm-started from the best baseline
    assert not res.optimal and res.hint != "none"
    assert res.lower_bound <= res.makespan
    validate_orders(model, res.orders)
    assert simulate(model, res.orders).makespan == pytest.approx(res.makespan)


def test_the_default_start_is_a_baseline_never_the_planner(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference the planner is judged against must not start from (nor be capped by) its plan:
    the default warm start is the shortest baseline within the memory, and the planner is never run."""
    from titan_morph.pipelining.reference.exact import BASELINE_HINTS, baseline_hint
    from titan_morph.pipelining.search import driver as search

    def planner(*_args: object, **_kw: object) -> None:
        raise AssertionError("the exact solver ran the planner under evaluation")

    monkeypatch.setattr(search, "search", planner)
    monkeypatch.setattr(search, "search_detailed", planner)
    model = TINY[0]
    res = optimal_makespan(model, time_limit_s=20)
    found = baseline_hint(model)
    assert found is not None and found[0] in BASELINE_HINTS and res.hint == found[0]
    validate_orders(model, found[1])
    # No baseline fits M = 1 (1F1B's first stage holds 3): no start, still the optimum (one at a time).
    tight = CostModel.uniform(3, 2, 1.0, 1.0, 1.0, memory=1)
    assert baseline_hint(tight) is None
    res = optimal_makespan(tight, time_limit_s=20)
    assert res.hint == "none" and res.optimal
    assert res.makespan == pytest.approx(simulate(tight, res.orders).makespan)
