"""The end-of-run summary: phases of a run around a straggler, and the simulated baseline beside them."""

from __future__ import annotations

import tracemalloc

import pytest

from titan_morph.pipelining.core.links import StaticDelays
from titan_morph.pipelining.core.model import CostModel
from titan_morph.pipelining.core.stragglers import RandomDelays
from titan_morph.runtime.summary import SIMULATED, StepHistory, StepPoint, StepSample, summary_lines, zbh2_ms

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


def _history(points: list[StepPoint], window: tuple[int, int] | None, **kw: int) -> StepHistory:
    history = StepHistory(window, **kw)
    for p in points:
        history.append(p)
    return history


def _steps(sample: StepSample) -> list[int]:
    return [s for s, _ in sample.starts(len(sample))]


def test_phases_follow_the_injection_window_and_skip_the_warm_up() -> None:
    parts = _history(_run(), (4, 7)).phases()
    assert _steps(parts["before"]) == [2, 3]
    assert _steps(parts["during"]) == [4, 5, 6, 7] and _steps(parts["adapted"]) == [6, 7]
    assert _steps(parts["after"]) == [8, 9, 10]
    monitored = _history(_run(), None).phases()  # the monitor's slow steps
    assert {name: _steps(s) for name, s in monitored.items()} == {name: _steps(s) for name, s in parts.items()}


def test_monitor_phases_take_a_healthy_step_between_two_slow_ones_as_during() -> None:
    points = [StepPoint(s, 700.0 + s, (1,) if s in (4, 7) else (), (), "b" if s >= 6 else "a") for s in range(1, 10)]
    parts = _history(points, None).phases()
    assert _steps(parts["before"]) == [2, 3] and _steps(parts["during"]) == [4, 5, 6, 7]
    assert _steps(parts["adapted"]) == [6, 7] and _steps(parts["after"]) == [8, 9]
    assert parts["during"].first == 4 and parts["during"].last == 7 and parts["during"].count == 4


def test_summary_compares_with_zbh2_under_the_same_delays() -> None:
    links = StaticDelays((0.0, 0.0, 60.0))
    history = _history(_run(), (4, 7))
    lines = summary_lines(history, model=MODEL, links=links, depth=2, decisions=1, schedule="PipeMorph")
    assert "ZB-H2 from the simulator" in lines[0]
    during = next(line for line in lines if line.lstrip().startswith("during"))
    zbh2 = zbh2_ms(MODEL, links, 2, [(p.step, p.start_ms) for p in _run() if 4 <= p.step <= 7])
    assert zbh2 is not None and zbh2 > 1.5 * 860.0  # ZB-H2 does not absorb 60 ms on the last link
    assert "steps   4-7" in during and f"{zbh2:.0f} ms ({zbh2 / 860.0:.2f}x)" in during
    adapted = next(line for line in lines if line.lstrip().startswith("adapted"))
    assert "820 ms" in adapted and "delegated links [2]" in adapted
    # no schedule beats 30 + 60 ms to the last rank plus its 24 x 30 ms of work
    assert "bound   810 ms" in during and "bound   810 ms" in adapted
    assert lines[-1].strip() == "plan changes made by the monitor: 1"


def test_summary_simulates_each_step_from_its_own_start_under_time_keyed_delays() -> None:
    """Random stragglers are keyed by time: the same step started elsewhere meets other delays."""
    links = RandomDelays(3, 30.0, 10.0, (100.0, 200.0), seed=1)
    starts = [(5, t) for t in (0.0, 4000.0, 9000.0)]
    each = [zbh2_ms(MODEL, links, 2, [s]) for s in starts]
    assert len(set(each)) == 3, each
    assert zbh2_ms(MODEL, links, 2, starts) == sorted(each)[1]  # the median of the three


def test_summary_without_modelled_delays_has_no_baseline_column() -> None:
    """A link that really broke has no delay model: the simulated baseline would be meaningless."""
    history = _history(_run(), (4, 7))
    lines = summary_lines(history, model=MODEL, links=None, depth=2, decisions=0, schedule="PipeMorph")
    assert lines[0] == "run summary (median pipeline time per step):"
    assert not any("ZB-H2" in line or "bound" in line for line in lines)
    assert any(line.lstrip().startswith("before") and "760 ms" in line for line in lines)


@pytest.mark.parametrize("window", [None, (20, 30)])
def test_no_straggler_is_one_line(window) -> None:
    history = _history(_run()[:3], window)
    lines = summary_lines(history, model=MODEL, links=None, depth=2, decisions=0, schedule="X")
    assert lines == ["run summary: no straggler; median pipeline time 760 ms over 2 steps"]


def test_a_sample_keeps_every_step_while_it_fits_then_a_doubling_stride() -> None:
    sample = StepSample(cap=8)
    for step in range(1, 7):
        sample.add(StepPoint(step, float(step), (), (step % 3,), "p", start_ms=10.0 * step))
    assert _steps(sample) == [1, 2, 3, 4, 5, 6] and sample.median_ms() == 3.5 and sample.delegated == {0, 1, 2}
    for step in range(7, 81):
        sample.add(StepPoint(step, float(step), (), (), "p"))
    assert sample.count == 80 and (sample.first, sample.last) == (1, 80)
    assert sample.stride == 16 and _steps(sample) == [16, 32, 48, 64, 80]
    later = StepSample(cap=8)
    for step in range(81, 90):
        later.add(StepPoint(step, float(step), (), (), "p"))
    sample.merge(later)
    assert sample.count == 89 and sample.last == 89 and _steps(sample) == [16, 32, 48, 64, 80]
    assert [s for s, _ in sample.starts(2)] == [32, 64]  # the simulator's share: a coarser stride
    with pytest.raises(ValueError, match="cap"):
        StepSample(cap=0)


def test_step_history_memory_and_exit_work_do_not_grow_with_the_run() -> None:
    """Ten times the cap of steps, in and out of a straggler: every sample stays within its cap,
    the memory flat after the first cap's steps, and the simulator's share within SIMULATED."""
    cap = 500
    history = StepHistory(None, cap=cap)
    tracemalloc.start()
    try:
        for step in range(1, 10 * cap + 1):
            slow = (1,) if 2_000 <= step <= 4_000 and step % 7 else ()
            history.append(StepPoint(step, 700.0 + step % 13, slow, (1,) if slow else (), "ab"[step // 3_000 % 2]))
            if step == 2 * cap:
                base = tracemalloc.get_traced_memory()[0]
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    parts = history.phases()
    assert all(len(s) <= cap and len(s.starts()) <= SIMULATED for s in parts.values())
    assert parts["during"].first == 2_000 and parts["during"].last == 4_000
    assert parts["after"].first == 4_001 and parts["after"].count == 10 * cap - 4_000
    assert grown < 40_000, f"{grown} bytes over {8 * cap} steps"
