"""The detector's rule: Eq. 1 threshold, k/m hysteresis, determinism, and the decisions' numbers."""

import random

import pytest

from titan_morph.monitor.delays import LinkEstimate
from titan_morph.monitor.detect import Decision, Detector, DetectRule

TOL = [10.0, 10.0, 10.0]  # Eq. 1 tolerance of the initial plan: Δ = 2, t = 10 ms


def est(*delays: float | None, bound: bool = False) -> list[LinkEstimate]:
    out = []
    for link, d in enumerate(delays):
        e = LinkEstimate(link)
        if d is not None:
            (e.bounds if bound else e.exact).extend([d - 0.5, d, d + 0.5])
        out.append(e)
    return out


def run(det: Detector, steps: list[list[LinkEstimate]], tol=TOL, tol0=TOL, start: int = 1) -> dict[int, Decision]:
    out = {}
    for i, e in enumerate(steps):
        d = det.update(start + i, e, tol, tol0)
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
    # eased: 25 < 85 / 2 once the window (k = 2 steps) holds only the new delay: steps 6 and 7
    got = run(det, [est(20.0)] * 4, tol=[85.0], tol0=[10.0], start=5)
    assert list(got) == [7] and got[7].delays_ms == (25.0,) and "eased" in got[7].reasons[0]


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
