"""The paper's worked examples: Fig. 4/5 (§3.1), PipeMorph's fix for Fig. 5, and a Fig. 8 analog.

Fig. 4/5: S = 4, N = 12, t^F = t^B = t^W = 10 ms. ZB-H2 (x = 7, 5, 3, 1) planned with no delay
completes in 390 ms; the same orders executed with c_0 = 10 ms take 400 ms and with c_0 = 20 ms
440 ms (the cascade); PipeMorph (Alg. 2 + Alg. 3/4) planned for c_0 = 20 ms takes <= 410 ms.
"""

from __future__ import annotations

import pytest

from titan_morph.pipelining.core.model import CostModel
from titan_morph.pipelining.schedules.generate import generate
from titan_morph.pipelining.schedules.slackness import tolerance_ms, uniform_warmup
from titan_morph.pipelining.search.builders import build
from titan_morph.pipelining.timing.simulate import makespan, simulate

T = 10.0


@pytest.fixture(scope="module")
def fig4_plan():
    model = CostModel.uniform(4, 12, T, T, T)
    plan = build("zb-h2", model)
    assert plan.warmup == (7, 5, 3, 1)
    return plan


def test_fig4_zero_bubble_390ms(fig4_plan) -> None:
    result = simulate(fig4_plan.model, fig4_plan.orders)
    assert result.makespan == 390.0
    # "zero bubbles": every stage computes 360 ms; only the fill (i·t) and drain ((S-1-i)·t) are idle.
    for s, timings in enumerate(result.timings):
        assert timings[0].start == s * T
        assert timings[-1].end == 360.0 + s * T
        assert all(b.start == a.end for a, b in zip(timings, timings[1:]))


@pytest.mark.parametrize(("c0", "expected"), [(10.0, 400.0), (20.0, 440.0)])
def test_fig5_same_orders_under_delay(fig4_plan, c0: float, expected: float) -> None:
    delayed = fig4_plan.model.with_delays([c0, 0.0, 0.0])
    assert makespan(delayed, fig4_plan.orders) == expected
    assert simulate(delayed, fig4_plan.orders).makespan == expected


def test_fig5_cascade_starts_beyond_tolerance(fig4_plan) -> None:
    """Eq. 1 / Theorem 1: Δ_0 = 2 absorbs (Δ − 1)·t = 10 ms; 20 ms cascades (+50 ms, not +20)."""
    assert tolerance_ms(fig4_plan.model, fig4_plan.warmup, 0) == 10.0
    delayed = fig4_plan.model.with_delays([20.0, 0.0, 0.0])
    result = simulate(delayed, fig4_plan.orders)
    # The paper: "the 20 ms delay pushes the first backward B_1 and subsequent F_8 in S_0 back to
    # t = 110 ms" (1-based microbatches: our I0 and F7; no delay: I0 at 70 ms).
    stage0 = {str(t.op): t for t in result.timings[0]}
    assert stage0["I0"].start == 110.0 and stage0["F7"].start == 120.0
    assert any(step.via == "link" for step in result.critical_path)


def test_pipemorph_fixes_fig5() -> None:
    model = CostModel.uniform(4, 12, T, T, T, delays=[20.0, 0.0, 0.0])
    plan = build("pipemorph", model)
    assert plan.warmup == (8, 5, 3, 1)  # Alg. 2: Δ_0 = (10 + 10 + 2·20) / 20 = 3
    span = makespan(model, plan.orders)
    assert span <= 410.0
    zb_h2_planned_without_delay = build("zb-h2", model.with_delays([0.0, 0.0, 0.0])).orders
    assert span < makespan(model, zb_h2_planned_without_delay) == 440.0


def _accumulated(stages: int, link: int, slackness: int, delays: list[float]) -> list[float]:
    """Makespan increase over the no-delay makespan, per delay, of a plan with uniform Δ."""
    base_model = CostModel.uniform(stages, 30, T, T, T)
    x = uniform_warmup(stages, 30, slackness)
    base = makespan(base_model, generate(base_model, x))
    out = []
    for c in delays:
        d = [0.0] * (stages - 1)
        d[link] = c
        model = base_model.with_delays(d)
        out.append(makespan(model, generate(model, x)) - base)
    return out


@pytest.mark.parametrize("slackness", [2, 3, 4])
def test_fig8_knee_at_theorem1_threshold(slackness: int) -> None:
    """N = 30, t = 10 ms, one slow link (the last: least downstream slack, §7.2).

    The pipeline keeps its warm-up counts x_i = 1 + Δ(S − 1 − i) (the generator schedules around
    the delay with these x_i, as Fig. 8's "ZB pipelines with slackness Δ"). Up to Theorem 1's
    threshold (Δ − 1)·t the accumulated delay is Θ(c) (here exactly c); a few t beyond it, each extra
    ms of link delay costs many ms of iteration time (the cascade), and the knee moves right with Δ.
    """
    threshold = (slackness - 1) * T
    below = [c for c in range(0, int(threshold) + 1, 5)]
    acc = _accumulated(4, 2, slackness, below)
    for c, a in zip(below, acc):
        assert a <= c + 1e-6, f"Δ={slackness}: c={c} ms below the threshold cost {a} ms"
    lo, hi = threshold + 3 * T, threshold + 4 * T
    a_lo, a_hi = _accumulated(4, 2, slackness, [lo, hi])
    assert (a_hi - a_lo) / (hi - lo) >= 5.0, f"Δ={slackness}: no cascade beyond the threshold"
    assert a_hi >= 2.5 * hi


def test_fig8_knee_moves_with_slackness() -> None:
    cs = list(range(0, 81, 5))
    knees = []
    for slackness in (2, 3, 4):
        acc = _accumulated(4, 2, slackness, cs)
        knees.append(next(c for c, a, b in zip(cs, acc, acc[1:]) if (b - a) / 5 > 2))
    assert knees == sorted(knees) and knees[0] < knees[-1]


@pytest.mark.parametrize("link", [0, 1, 2])
@pytest.mark.parametrize("slackness", [2, 3, 4])
def test_fig8_fixed_orders_with_refill(link: int, slackness: int) -> None:
    """Theorem 1 on FIXED orders planned without delay (the run-time situation).

    With ``refill=True`` every stage stays x_i forwards ahead, so the orders absorb
    c <= (Δ − 1)·t (accumulated delay Θ(c): at most 2c) and each ms beyond costs >= 5 ms.
    """
    stages, n = 4, 30
    model = CostModel.uniform(stages, n, T, T, T)
    orders = generate(model, uniform_warmup(stages, n, slackness), refill=True)
    base = makespan(model, orders)

    def acc(c: float) -> float:
        d = [0.0] * (stages - 1)
        d[link] = c
        return makespan(model.with_delays(d), orders) - base

    threshold = (slackness - 1) * T
    for c in (0.0, threshold / 2, threshold):
        assert acc(c) <= 2 * c + 1e-6
    assert acc(threshold + T) - acc(threshold) >= 5 * T


def test_fig8_fixed_orders_without_refill_collapse_to_delta_two() -> None:
    """The paper's I > F > W drains the warm-up lead: fixed orders then tolerate only ~t."""
    model = CostModel.uniform(4, 30, T, T, T)
    for slackness in (3, 4):
        orders = generate(model, uniform_warmup(4, 30, slackness))
        base = makespan(model, orders)
        assert makespan(model.with_delays([0.0, 0.0, 2 * T]), orders) - base > 10 * T
