"""The compute model (pure): static, random, trace and windowed factors, and the simulator's view of
them (stage times x the factor of their rank)."""

from __future__ import annotations

import pytest

from titan_morph.pipelining.builders import build
from titan_morph.pipelining.model import CostModel
from titan_morph.pipelining.simulate import makespan
from titan_morph.pipelining.speeds import RandomFactors, StaticFactors, TraceFactors, WindowedFactors, is_compute_trace


def test_static_window_and_speeds():
    model = WindowedFactors(StaticFactors((1.0, 1.0, 1.0, 2.0)), start_step=4, end_step=6)
    assert [model.factor(3, s) for s in (3, 4, 6, 7)] == [1.0, 2.0, 2.0, 1.0]
    assert model.speeds(5) == (1.0, 1.0, 1.0, 0.5)


def test_random_factors_are_a_function_of_seed_rank_and_step():
    a, b = RandomFactors((1.0, 3.0), seed=1), RandomFactors((1.0, 3.0), seed=1)
    draws = [a.factor(1, s) for s in range(1, 50)]
    assert draws == [b.factor(1, s) for s in range(1, 50)] and all(1.0 <= d <= 3.0 for d in draws)
    assert len(set(draws)) > 40 and all(a.factor(0, s) == 1.0 for s in range(1, 50))
    assert draws != [RandomFactors((1.0, 3.0), seed=2).factor(1, s) for s in range(1, 50)]


def test_trace_factors_are_piecewise_constant(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("step,rank,compute_factor\n4,3,2\n9,3,1.5\n12,3,1\n")
    assert is_compute_trace(path)
    model = TraceFactors.from_csv(path, 4)
    assert [model.factor(3, s) for s in (1, 4, 8, 9, 12, 20)] == [1.0, 2.0, 2.0, 1.5, 1.0, 1.0]
    with pytest.raises(ValueError, match="rank 7 is out of range"):
        TraceFactors(4, ((1, 7, 2.0),))
    with pytest.raises(ValueError, match="finite and > 0"):
        StaticFactors((1.0, 0.0))


def test_the_simulator_times_stage_times_times_the_factors():
    """S = 4, N = 24, F = B = W = 10 ms, rank 3 twice as slow: 1470 ms whatever the schedule can do."""
    model = CostModel.uniform(4, 24, 10.0, 10.0, 10.0)
    slow = StaticFactors((1.0, 1.0, 1.0, 2.0)).scale(model, 1)
    assert slow.fwd == (10.0, 10.0, 10.0, 20.0) and slow.wgt[3] == 20.0
    assert makespan(slow, build("zb-h2", slow).orders) == pytest.approx(1470.0)
    assert StaticFactors((1.0,) * 4).scale(model, 1) is model
