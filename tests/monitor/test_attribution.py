"""What each straggler costs: the simulated step under the measured times against the same with one
link or rank at its baseline (titan_morph.monitor.attribution), and the summary's top causes."""

from __future__ import annotations

import pytest

from titan_morph.monitor.attribution import (
    Attribution,
    CostGate,
    Measured,
    StragglerCosts,
    cause_names,
    straggler_costs,
)
from titan_morph.monitor.delays import LinkEstimate
from titan_morph.monitor.detect import DetectRule
from titan_morph.monitor.profile import StepProfile
from titan_morph.pipelining.core.model import CostModel
from titan_morph.pipelining.search.builders import build
from titan_morph.pipelining.timing.simulate import makespan
from titan_morph.runtime.summary import CostTally, StepHistory, StepPoint, summary_lines

S, N = 4, 12
BASE = CostModel.uniform(S, N, 10.0, 10.0, 10.0)
PLAN = build("zb-h2", BASE)
RULE = DetectRule(floor_ms=5.0)


def _measured(speeds=(1.0,) * S, latency=(0.0,) * (S - 1), transmit=(0.0,) * (S - 1), off=()) -> Measured:
    return Measured(1, tuple(speeds), tuple(latency), tuple(transmit), (0.0,) * (S - 1), tuple(off))


def _profile(stage: int, factor: float = 1.0) -> StepProfile:
    ms = 10.0 * factor
    return StepProfile(stage, 0, 0.0, 100.0, {"F": (ms * N, N), "I": (ms * N, N), "W": (ms * N, N)})


def _estimates(delays: dict[int, float]) -> list[LinkEstimate]:
    return [LinkEstimate(link, exact=[delays.get(link, 1.0)] * 4) for link in range(S - 1)]


def test_a_slow_links_cost_is_the_simulated_difference() -> None:
    measured = _measured(latency=(1.0, 2.0, 60.0), off=("link2",))
    full, costs = straggler_costs(BASE, PLAN.orders, measured, depth=2)
    slow = makespan(BASE.with_delays((1.0, 2.0, 60.0)), PLAN.orders, depth=2)
    healed = makespan(BASE.with_delays((1.0, 2.0, 0.0)), PLAN.orders, depth=2)
    assert full == slow and costs == {"link2": slow - healed}
    assert costs["link2"] > 60.0  # ZB-H2 planned for no delay pays it more than once (paper Fig. 5)


def test_a_slow_ranks_cost_is_the_simulated_difference_and_a_link_keeps_its_baseline_transmit() -> None:
    measured = Measured(1, (1.0, 1.0, 1.0, 0.5), (0.0, 0.0, 0.0), (0.0, 0.0, 4.0), (0.0, 0.0, 1.0), ("link2", "rank3"))
    full, costs = straggler_costs(BASE, PLAN.orders, measured, depth=None)
    slowed = CostModel.uniform(S, N, (10, 10, 10, 20), (10, 10, 10, 20), (10, 10, 10, 20))
    assert full == makespan(slowed.with_transmit((0.0, 0.0, 4.0)), PLAN.orders)
    assert costs["rank3"] == full - makespan(BASE.with_transmit((0.0, 0.0, 4.0)), PLAN.orders)
    assert costs["link2"] == full - makespan(slowed.with_transmit((0.0, 0.0, 1.0)), PLAN.orders)
    assert costs["rank3"] > 0 and costs["link2"] >= 0


def _fed(costs: StragglerCosts, steps: int, factor: float = 1.0, delays: dict[int, float] | None = None):
    out = None
    for step in range(1, steps + 1):
        profiles = [_profile(r, factor if r == S - 1 else 1.0) for r in range(S)]
        out = costs.observe(step, profiles, _estimates(delays or {}))
    return out


def test_nothing_costs_anything_at_the_baseline_and_only_causes_off_it_are_timed() -> None:
    costs = StragglerCosts(S, RULE, profile_steps=2)
    assert _fed(costs, 2) is None  # a warm-up step, then one baseline step of two
    measured = _fed(costs, 1)  # the second baseline step: the baseline is known from the next one on
    assert measured is None and costs.stage_times == ((10.0, 10.0, 10.0),) * S
    measured = _fed(costs, 1)
    assert measured is not None and measured.off == () and measured.speeds == (1.0,) * S
    att = costs.attribute(measured, PLAN.orders, N, depth=2)
    assert att is not None and att.off == () and set(att.costs) == set(cause_names(S))
    assert all(v == 0.0 for v in att.costs.values())
    assert att.makespan_ms == makespan(BASE.with_delays((1.0, 1.0, 1.0)), PLAN.orders, depth=2)


def test_a_rank_twice_as_slow_and_a_delayed_link_are_found_and_costed() -> None:
    costs = StragglerCosts(S, RULE, profile_steps=2)
    _fed(costs, 3)
    measured = _fed(costs, 1, factor=2.0, delays={2: 60.0})
    assert measured is not None and measured.speeds == (1.0, 1.0, 1.0, 0.5)
    assert measured.off == ("link2", "rank3") and measured.latency_ms == (1.0, 1.0, 60.0)
    att = costs.attribute(measured, PLAN.orders, N, depth=None)
    assert att is not None
    full, expected = straggler_costs(BASE, PLAN.orders, measured, depth=None)
    assert att.makespan_ms == full and att.costs == {
        "link0": 0.0,
        "link1": 0.0,
        "rank0": 0.0,
        "rank1": 0.0,
        "rank2": 0.0,
        "host": 0.0,
        "links": 0.0,
        **expected,
    }
    assert att.costs["rank3"] > 0 and att.costs["link2"] > 0  # each measured with the other still there


def test_a_rank_within_the_margin_and_a_link_under_the_floor_stay_at_the_baseline() -> None:
    costs = StragglerCosts(S, RULE, profile_steps=1)
    _fed(costs, 2)
    measured = _fed(costs, 1, factor=1.05, delays={1: 4.0})
    assert measured is not None and measured.off == ()


def test_the_tally_names_the_costliest_causes_first_with_ms_and_share() -> None:
    tally = CostTally(cap=4)
    for step in range(1, 11):
        tally.add(step, {"link2": 60.0, "rank3": 700.0 if step > 5 else 0.0, "link0": -1.0}, 1500.0)
    top = tally.top()
    assert [t[0] for t in top] == ["rank3", "link2"]  # by time lost in all; a cause that saved time is left out
    assert top[0][1] == pytest.approx(350.0) and top[1][1] == 60.0 and top[1][2] == pytest.approx(4.0)
    assert tally.total_ms == {"link2": 600.0, "rank3": 3500.0, "link0": -10.0}
    lines = tally.lines(limit=1)
    assert len(lines) == 2 and lines[1].split()[:2] == ["rank", "3"] and "3.5 s in all" in lines[1]


def test_the_run_summary_lists_the_costs_after_the_phases() -> None:
    history = StepHistory((3, 6))
    for step in range(1, 9):
        history.append(StepPoint(step, 900.0 if 3 <= step <= 6 else 760.0, (), (), "p"))
        if 3 <= step <= 6:
            history.costs.add(step, {"link2": 140.0}, 900.0)
    lines = summary_lines(history, model=BASE, links=None, depth=2, decisions=0, schedule="ZBH2")
    assert "what the stragglers cost" in lines[-2]
    assert lines[-1].split()[:5] == ["link", "2", "140", "ms", "per"] and "(15.6 % of the step)" in lines[-1]
    assert "over 4 steps (3-6)" in lines[-1]
    quiet = StepHistory(None)
    quiet.append(StepPoint(2, 760.0, (), (), "p"))
    assert len(summary_lines(quiet, model=BASE, links=None, depth=2, decisions=0, schedule="ZBH2")) == 1


def test_without_the_straggler_the_better_of_the_adapted_and_the_initial_plan_runs() -> None:
    base = CostModel.uniform(S, 24, 10.0, 10.0, 10.0, memory=7)  # the testbed's N and memory budget
    adapted, initial = build("pipemorph", base.with_delays((0.0, 0.0, 65.0))), build("pipemorph", base)
    measured = _measured(latency=(3.0, 3.0, 60.0), off=("link2",))
    full, same = straggler_costs(base, adapted.orders, measured, depth=2)
    _, either = straggler_costs(base, adapted.orders, measured, depth=2, initial=initial.orders)
    healed_adapted = makespan(base.with_delays((3.0, 3.0, 0.0)), adapted.orders, depth=2)
    healed_initial = makespan(base.with_delays((3.0, 3.0, 0.0)), initial.orders, depth=2)
    assert same == {"link2": full - healed_adapted}
    assert either == {"link2": full - min(healed_adapted, healed_initial)}
    assert healed_initial < healed_adapted  # the plan made for 65 ms has no slack left on links 0 and 1


def test_two_stages_per_rank_take_their_baseline_per_stage_and_their_speed_per_rank() -> None:
    ranks, n = 4, 8
    base = CostModel.uniform(2 * ranks, n, 5.0, 5.0, 5.0, stages_per_rank=2)
    plan = build("pipemorph-v", base)

    def profile(rank: int, factor: float) -> StepProfile:
        per_stage = {s: {k: (5.0 * factor * n, n) for k in "FIW"} for s in base.rank_stages(rank)}
        total = {k: (5.0 * factor * 2 * n, 2 * n) for k in "FIW"}
        return StepProfile(rank, 0, 0.0, 100.0, total, stage_compute=per_stage)

    costs = StragglerCosts(2 * ranks, RULE, profile_steps=1, stages_per_rank=2)
    for _ in range(2):
        assert costs.observe(1, [profile(r, 1.0) for r in range(ranks)], _estimates({})) is None
    assert costs.stage_times == ((5.0, 5.0, 5.0),) * (2 * ranks)
    measured = costs.observe(3, [profile(r, 2.0 if r == 1 else 1.0) for r in range(ranks)], _estimates({}))
    assert measured is not None and measured.speeds == (1.0, 0.5, 1.0, 1.0) and measured.off == ("rank1",)
    att = costs.attribute(measured, plan.orders, n, depth=None)
    slowed = CostModel.uniform(
        2 * ranks,
        n,
        (5, 10, 5, 5, 5, 5, 10, 5),
        (5, 10, 5, 5, 5, 5, 10, 5),
        (5, 10, 5, 5, 5, 5, 10, 5),
        stages_per_rank=2,
    )
    delays = (1.0, 1.0, 1.0)
    full = makespan(slowed.with_delays(delays), plan.orders)
    assert att is not None and att.makespan_ms == full
    assert att.costs["rank1"] == full - makespan(base.with_delays(delays), plan.orders) > 0


# -- what is charged: costs above the step's noise only ----------------------------------------------


def _att(step: int, costs: dict[str, float]) -> Attribution:
    return Attribution(step, 1000.0, costs, tuple(c for c, ms in costs.items() if ms), 0.0)


def _quiet_steps(gate: CostGate, steps: range, ms=lambda step: 1000.0 + (step % 5) * 4.0) -> None:
    for step in steps:
        assert gate.admit(_att(step, {}), ms(step)) == []


def test_noise_and_single_spikes_are_never_charged() -> None:
    gate = CostGate(DetectRule(detect_steps=3, recover_steps=5, margin=0.1))
    _quiet_steps(gate, range(1, 21))
    noise = gate.noise_ms()
    assert noise is not None and noise == pytest.approx(50.4)  # half the margin of the steps' median (1008 ms)
    charged = []
    for step in range(21, 61):  # each rank off in one step of three, costs under the noise or alone
        spike = {f"rank{step % 4}": 300.0 if step % 3 == 0 else 40.0}
        charged += gate.admit(_att(step, spike), 1040.0)
    assert charged == []


def test_a_sustained_cost_is_charged_from_its_first_step_once_confirmed_and_ends_after_recovery() -> None:
    gate = CostGate(DetectRule(detect_steps=3, recover_steps=2, margin=0.1))
    _quiet_steps(gate, range(1, 11))
    assert gate.admit(_att(11, {"rank3": 200.0}), 1200.0) == []
    assert gate.admit(_att(12, {"rank3": 210.0}), 1210.0) == []
    assert gate.admit(_att(13, {"rank3": 190.0}), 1190.0) == [
        (11, "rank3", 200.0, 1200.0),
        (12, "rank3", 210.0, 1210.0),
        (13, "rank3", 190.0, 1190.0),
    ]
    assert gate.admit(_att(14, {"rank3": 205.0}), 1205.0) == [(14, "rank3", 205.0, 1205.0)]
    assert gate.charged() == ("rank3",)
    assert gate.admit(_att(15, {}), 1000.0) == [] and gate.admit(_att(16, {}), 1000.0) == []
    assert gate.charged() == ()
    assert gate.admit(_att(17, {"rank3": 200.0}), 1200.0) == []  # a new run: confirmed again first


def test_a_link_the_monitor_holds_is_charged_at_once() -> None:
    gate = CostGate(DetectRule(detect_steps=3))
    _quiet_steps(gate, range(1, 6))
    assert gate.admit(_att(6, {"link2": 20.0}), 1020.0, held={"link2"}) == [(6, "link2", 20.0, 1020.0)]


def test_every_rank_off_at_once_is_one_cause_the_host() -> None:
    costs = StragglerCosts(S, RULE, profile_steps=1)
    _fed(costs, 2)
    slower = [_profile(r, 1.5) for r in range(S)]
    measured = costs.observe(3, slower, _estimates({}))
    assert measured is not None and measured.off == ("host",)
    att = costs.attribute(measured, PLAN.orders, N, depth=None)
    healed = makespan(BASE.with_delays((1.0, 1.0, 1.0)), PLAN.orders)  # every rank at speed 1
    assert att is not None and att.costs["host"] == pytest.approx(att.makespan_ms - healed)
    assert all(ms == 0.0 for cause, ms in att.costs.items() if cause != "host")
    delayed = costs.observe(4, [_profile(r) for r in range(S)], _estimates({0: 20.0, 1: 20.0, 2: 20.0}))
    assert delayed is not None and delayed.off == ("links",)


def test_a_quiet_run_says_no_straggler_and_a_charged_one_names_it_in_the_head_line() -> None:
    quiet = StepHistory(None)
    for step in range(1, 9):
        quiet.append(StepPoint(step, 760.0, (), (), "p"))
    lines = summary_lines(quiet, model=BASE, links=None, depth=2, decisions=0, schedule="ZBH2")
    assert lines == ["run summary: no straggler; median pipeline time 760 ms over 7 steps"]
    quiet.costs.add(5, {"rank3": 300.0}, 1060.0)
    lines = summary_lines(quiet, model=BASE, links=None, depth=2, decisions=0, schedule="ZBH2")
    assert lines[0].startswith("run summary: straggler rank 3 (costs below);"), lines
    assert lines[-1].split()[:2] == ["rank", "3"]


def test_a_cost_the_measured_step_does_not_show_is_not_charged():
    gate = CostGate(DetectRule(detect_steps=3, margin=0.1))
    _quiet_steps(gate, range(1, 11))  # median 1008 ms, noise 50.4 ms
    # rank 2's op times read slow for five steps (its simulated cost 200 ms), the step itself did not
    assert all(gate.admit(_att(step, {"rank2": 200.0}), 1012.0) == [] for step in range(11, 16))
    assert gate.charged() == ()
