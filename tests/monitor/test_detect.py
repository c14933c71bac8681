"""The detector's rule: Eq. 1 threshold, k/m hysteresis, determinism, and the decisions' numbers."""

import random

import pytest

from titan_morph.monitor.bandwidth import WireEstimate
from titan_morph.monitor.delays import LinkEstimate
from titan_morph.monitor.detect import MOVE_WINDOW, MOVES_PER_WINDOW, Decision, Detector, DetectRule, Verdict

TOL = [10.0, 10.0, 10.0]  # Eq. 1 tolerance of the initial plan: Δ = 2, t = 10 ms


def est(*delays: float | None, bound: bool = False) -> list[LinkEstimate]:
    out = []
    for link, d in enumerate(delays):
        e = LinkEstimate(link)
        if d is not None:
            (e.bounds if bound else e.exact).extend([d - 0.5, d, d + 0.5])
        out.append(e)
    return out


def run(
    det: Detector, steps: list[list[LinkEstimate]], tol=TOL, tol0=TOL, start: int = 1, judge=None
) -> dict[int, Decision]:
    out = {}
    for i, e in enumerate(steps):
        d = det.update(start + i, e, tol, tol0, judge=judge)
        if d is not None:
            out[start + i] = d
    return out


def test_slow_after_k_consecutive_steps_and_plans_rounded_quantile():
    det = Detector(3, DetectRule(detect_steps=3))
    quiet = [est(0.4, 0.5, 0.6)] * 4
    slow = [est(0.4, 0.5, 61.0)] * 3
    got = run(det, quiet + slow)
    assert list(got) == [7]  # injected from step 5: decided after its 3rd slow step
    d = got[7]
    assert d.newly_slow == (2,) and d.slow_links == (2,)
    assert d.delays_ms == (0.0, 0.0, 65.0)  # p75 of 60.5..61.5 rounded up to 5 ms
    assert "link 2 slow" in d.reasons[0] and "61.0 ms > 11.0 ms" in d.reasons[0]


def test_interrupted_slow_streak_does_not_trigger():
    det = Detector(3, DetectRule(detect_steps=3))
    steps = [est(0.5, 0.5, 40.0), est(0.5, 0.5, 40.0), est(0.5, 0.5, 2.0)] * 5
    assert run(det, steps) == {}


def test_floor_keeps_jitter_from_triggering_on_a_plan_without_slack():
    det = Detector(3, DetectRule(detect_steps=1, floor_ms=5.0))
    assert run(det, [est(4.0, 4.5, 4.9)] * 10, tol=[0.0, 0.0, 0.0]) == {}
    assert run(det, [est(4.0, 4.5, 6.0)], tol=[0.0, 0.0, 0.0]) != {}


def test_bounds_alone_never_detect_but_prove_recovery():
    rule = DetectRule(detect_steps=2, recover_steps=3)
    det = Detector(3, rule)
    assert run(det, [est(50.0, 50.0, 50.0, bound=True)] * 6) == {}  # consumer late, not the link
    got = run(det, [est(None, None, 60.0)] * 2, start=7)
    assert got[8].newly_slow == (2,)
    # adapted plan absorbs the delay: only bounds; still above the recovery threshold -> stays slow
    tol_adapted = [0.0, 0.0, 60.0]
    assert run(det, [est(None, None, 58.0, bound=True)] * 5, tol=tol_adapted, start=9) == {}
    got = run(det, [est(None, None, 1.0, bound=True)] * 3, tol=tol_adapted, start=14)
    assert list(got) == [16] and got[16].recovered == (2,) and got[16].all_healthy
    assert got[16].delays_ms == (0.0, 0.0, 0.0)


def test_worse_and_eased_replan_a_slow_link():
    rule = DetectRule(detect_steps=2, recover_steps=2)
    det = Detector(1, rule)
    got = run(det, [est(30.0)] * 2, tol=[10.0], tol0=[10.0])
    assert got[2].delays_ms == (35.0,)
    got = run(det, [est(80.0)] * 2, tol=[35.0], tol0=[10.0], start=3)  # beyond the adapted tolerance
    assert list(got) == [4] and got[4].delays_ms == (85.0,) and "worse" in got[4].reasons[0]
    # eased: k = 2 steps off the planned 85 ms by more than the band, the window holding only them
    got = run(det, [est(20.0)] * 4, tol=[85.0], tol0=[10.0], start=5)
    assert list(got) == [6] and got[6].delays_ms == (25.0,) and "eased" in got[6].reasons[0]
    assert got[6].slow_links == (0,)  # still slow: it has not recovered


class Judged:
    """A judge that answers ``pays`` and records what it was asked."""

    def __init__(self, pays: bool) -> None:
        self.pays, self.asked = pays, []

    def __call__(self, delays, transmit, age):
        self.asked.append((tuple(delays), tuple(transmit), age))
        return Verdict(self.pays, "judged")


def test_a_condition_moved_within_the_tolerance_is_put_to_the_judge_once():
    rule = DetectRule(detect_steps=2, recover_steps=3)
    det = Detector(2, rule)
    assert run(det, [est(0.5, 40.0)] * 2)[2].delays_ms == (0.0, 45.0)
    refuse = Judged(False)
    # 25 ms: inside the plan's tolerance (never "worse"), off its 45 ms by more than the band
    assert run(det, [est(0.5, 25.0)] * 8, tol=[10.0, 45.0], start=3, judge=refuse) == {}
    assert refuse.asked == [((0.0, 30.0), (0.0, 0.0), 2)]  # once: a refused condition is not asked again
    take = Judged(True)
    got = run(det, [est(0.5, 33.0)] * 2, tol=[10.0, 45.0], start=11, judge=take)
    assert list(got) == [12] and got[12].delays_ms == (0.0, 35.0) and "(judged)" in got[12].reasons[0]
    assert "moved" in got[12].reasons[0] or "eased" in got[12].reasons[0]


def test_a_condition_under_the_recovery_threshold_plans_as_healthy_before_it_recovers():
    det = Detector(1, DetectRule(detect_steps=2, recover_steps=4))
    run(det, [est(40.0)] * 2, tol=[10.0], tol0=[10.0])
    got = run(det, [est(1.0)] * 4, tol=[45.0], tol0=[10.0], start=3)
    # planned as healthy after k steps; reported recovered only after m
    assert list(got) == [4, 6] and got[4].delays_ms == (0.0,) and got[4].slow_links == (0,)
    assert got[6].recovered == (0,) and got[6].all_healthy


def test_a_rate_after_a_delay_moves_the_condition_to_the_transmit_time():
    det = Detector(1, DetectRule(detect_steps=2))
    run(det, [est(40.0)] * 2, tol=[10.0], tol0=[10.0])

    def rated(transmit: float) -> list[LinkEstimate]:
        (e,) = est(transmit + 1.0)
        e.wires[("default", "fwd")] = WireEstimate(messages=8, queued=4, latency_ms=1.0, transmit_ms=transmit)
        return [e]

    got = run(det, [rated(12.0)] * 2, tol=[45.0], tol0=[10.0], start=3)
    assert list(got) == [4] and got[4].delays_ms == (5.0,) and got[4].transmit_ms == (12.0,)


def test_flapping_conditions_move_the_plan_a_bounded_number_of_times():
    k = 2
    det = Detector(1, DetectRule(detect_steps=k, recover_steps=50))
    run(det, [est(40.0)] * k, tol=[10.0], tol0=[10.0])
    steps = ([est(20.0)] * k + [est(30.0)] * k) * 12  # moves every k steps, inside the tolerance
    got = run(det, steps, tol=[1000.0], tol0=[10.0], start=k + 1)
    moves = sorted(got)
    assert len(moves) >= MOVES_PER_WINDOW  # it does follow the condition ...
    window = MOVE_WINDOW * k
    for first in range(k + 1, k + 1 + len(steps)):  # ... but no more often than the bound
        assert sum(first <= s < first + window for s in moves) <= MOVES_PER_WINDOW


def test_same_inputs_same_decisions():
    rng = random.Random(7)
    steps = [est(*(max(0.0, rng.gauss(12, 8)) for _ in range(3))) for _ in range(60)]
    a = run(Detector(3, DetectRule(detect_steps=2, recover_steps=2)), steps)
    b = run(Detector(3, DetectRule(detect_steps=2, recover_steps=2)), steps)
    assert a == b and a  # the noisy input does decide something, identically


@pytest.mark.parametrize(
    "kw", [dict(detect_steps=0), dict(recover_steps=0), dict(recover_ratio=0), dict(quantum_ms=0), dict(margin=-1)]
)
def test_bad_rule_values(kw):
    with pytest.raises(ValueError):
        DetectRule(**kw)
