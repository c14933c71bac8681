"""The compute model (pure): static, random, trace and windowed factors, and the simulator's view of
them (stage times x the factor of their rank)."""

from __future__ import annotations

import pytest

from titan_morph.pipelining.core.model import CostModel
from titan_morph.pipelining.core.speeds import (
    RandomFactors,
    StaticFactors,
    TraceFactors,
    WindowedFactors,
    is_compute_trace,
)
from titan_morph.pipelining.search.builders import build
from titan_morph.pipelining.timing.simulate import makespan


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


def test_one_trace_sets_links_and_ranks(tmp_path):
    """The module docstring's example of :mod:`titan_morph.pipelining.core.trace_rows`: each row sets a
    link or a rank; each model reads its own rows."""
    from titan_morph.pipelining.core.stragglers import TraceDelays
    from titan_morph.pipelining.core.trace_rows import read_trace_rows

    path = tmp_path / "both.csv"
    path.write_text(
        "step,link,delay_ms,bandwidth_mbit,rank,compute_factor\n5,2,40,,,\n17,2,0,20,,\n29,2,0,0,,\n9,,,,1,1.5\n21,,,,1,1\n"
    )
    assert is_compute_trace(path) and read_trace_rows(path).links
    links = TraceDelays.from_csv(path, 3)
    assert [links.delay_ms(2, "fwd", step=s) for s in (4, 5, 17)] == [0.0, 40.0, 0.0]
    assert links.rate_mbit(2, "bwd", step=20) == 20.0 and links.rate_mbit(2, "bwd", step=30) == 0.0
    ranks = TraceFactors.from_csv(path, 4)
    assert [ranks.factor(1, s) for s in (8, 9, 21)] == [1.0, 1.5, 1.0] and ranks.factor(2, 10) == 1.0
    only_links = tmp_path / "links.csv"
    only_links.write_text("step,link,delay_ms\n3,0,10\n")
    assert read_trace_rows(only_links).links and not is_compute_trace(only_links)
    path.write_text("step,link,delay_ms,rank,compute_factor\n3,0,10,1,2\n")
    with pytest.raises(ValueError, match="line 2 names a link and a rank"):
        TraceFactors.from_csv(path, 4)
    path.write_text("step,link,delay_ms,rank,compute_factor\n3,,,,2\n")
    with pytest.raises(ValueError, match="line 2 names neither a link nor a rank"):
        read_trace_rows(path)
