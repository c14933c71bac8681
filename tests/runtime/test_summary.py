"""The end-of-run summary: phases of a run around a straggler, and the simulated baseline beside them."""

from __future__ import annotations

import tracemalloc

import pytest

from titan_morph.pipelining.links import RandomDelays, StaticDelays
from titan_morph.pipelining.model import CostModel
from titan_morph.runtime.summary import StepHistory, StepPoint, phases, summary_lines, zbh2_ms

MODEL = CostModel.uniform(4, 24, 10.0, 10.0, 10.0)


def _run() -> list[StepPoint]:
    """10 steps: a straggler on link 2 during steps 4-7, the adapted plan from step 6 on."""
    points = []
    for step in range(1, 11):
        during = 4 <= step <= 7
        plan = "adapted" if 6 <= step <= 7 else "initial"
        ms = 900.0 if during and plan == "initial" else (820.0 if during else 760.0)
        slow, delegated = (2,) if during else (), (2,) if plan == "adapted" else ()
        points.append(StepPoint(step, ms, slow, delegated, plan, start_ms=900.0 * step))
    return points


def test_phases_follow_the_injection_window_and_skip_the_warm_up() -> None:
    parts = phases(_run(), (4, 7))
    assert [p.step for p in parts["before"]] == [2, 3]
    assert [p.step for p in parts["during"]] == [4, 5, 6, 7]
    assert [p.step for p in parts["after"]] == [8, 9, 10]
    assert [p.step for p in phases(_run(), None)["during"]] == [4, 5, 6, 7]  # the monitor's slow steps


def test_summary_compares_with_zbh2_under_the_same_delays() -> None:
    links = StaticDelays((0.0, 0.0, 60.0))
    lines = summary_lines(_run(), window=(4, 7), model=MODEL, links=links, depth=2, decisions=1, schedule="PipeMorph")
    assert "ZB-H2 from the simulator" in lines[0]
    during = next(line for line in lines if line.lstrip().startswith("during"))
    zbh2 = zbh2_ms(MODEL, links, 2, [p for p in _run() if 4 <= p.step <= 7])
    assert zbh2 is not None and zbh2 > 1.5 * 860.0  # ZB-H2 does not absorb 60 ms on the last link
    assert f"{zbh2:.0f} ms ({zbh2 / 860.0:.2f}x)" in during
    adapted = next(line for line in lines if line.lstrip().startswith("adapted"))
    assert "820 ms" in adapted and "delegated links [2]" in adapted
    # no schedule beats 30 + 60 ms to the last rank plus its 24 x 30 ms of work
    assert "bound   810 ms" in during and "bound   810 ms" in adapted
    assert lines[-1].strip() == "plan changes made by the monitor: 1"


def test_summary_simulates_each_step_from_its_own_start_under_time_keyed_delays() -> None:
    """Random stragglers are keyed by time: the same step started elsewhere meets other delays."""
    links = RandomDelays(3, 30.0, 10.0, (100.0, 200.0), seed=1)
    starts = [StepPoint(5, 850.0, (), (), "p", start_ms=t) for t in (0.0, 4000.0, 9000.0)]
    each = [zbh2_ms(MODEL, links, 2, [p]) for p in starts]
    assert len(set(each)) == 3, each
    assert zbh2_ms(MODEL, links, 2, starts) == sorted(each)[1]  # the median of the three


def test_summary_without_modelled_delays_has_no_baseline_column() -> None:
    """A link that really broke has no delay model: the simulated baseline would be meaningless."""
    lines = summary_lines(_run(), window=(4, 7), model=MODEL, links=None, depth=2, decisions=0, schedule="PipeMorph")
    assert lines[0] == "run summary (median pipeline time per step):"
    assert not any("ZB-H2" in line or "bound" in line for line in lines)
    assert any(line.lstrip().startswith("before") and "760 ms" in line for line in lines)


@pytest.mark.parametrize("window", [None, (20, 30)])
def test_no_straggler_is_one_line(window) -> None:
    lines = summary_lines(_run()[:3], window=window, model=MODEL, links=None, depth=2, decisions=0, schedule="X")
    assert lines == ["run summary: no straggler; median pipeline time 760 ms over 2 steps"]


def test_step_history_gives_back_the_points_of_the_last_steps() -> None:
    history = StepHistory(capacity=6)
    points = [*_run(), StepPoint(11, None, (), (), "initial")]
    for p in points:
        history.append(p)
    assert list(history) == points[-6:] and len(history) == 6
    small = StepHistory()
    for p in points[:3]:
        small.append(p)
    assert list(small) == points[:3]
    with pytest.raises(ValueError, match="capacity"):
        StepHistory(capacity=0)


def test_step_history_memory_does_not_grow_with_the_run() -> None:
    history = StepHistory(capacity=1000)
    plans = ("initial", "adapted")
    tracemalloc.start()
    try:
        for step in range(1, 50_001):
            history.append(StepPoint(step, 700.0 + step % 13, (step // 1000 % 2,), (), plans[step // 5000 % 2]))
            if step == 5_000:
                base = tracemalloc.get_traced_memory()[0]
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown < 16_000, f"{grown} bytes over 45000 steps"
    assert [p.step for p in history] == list(range(49_001, 50_001))
