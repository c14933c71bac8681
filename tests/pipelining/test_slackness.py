"""Eq. 1 tolerance, Alg. 1 initial plan and Alg. 2 adapted plan (paper §4.1–§4.2)."""

from __future__ import annotations

import pytest

from titan_morph.pipelining.core.model import CostModel
from titan_morph.pipelining.schedules.slackness import (
    adapted_warmup,
    initial_warmup,
    required_slackness,
    tolerance_ms,
    tolerates,
    uniform_warmup,
)


def test_tolerance_matches_theorem1_for_uniform_times() -> None:
    model = CostModel.uniform(4, 12, 10, 10, 10)
    for delta in range(0, 6):
        x = (1 + 3 * delta, 1 + 2 * delta, 1 + delta, 1)
        assert tolerance_ms(model, x, 1) == pytest.approx((delta - 1) * 10)
    zb_h2 = (7, 5, 3, 1)  # Δ = 2: tolerates 10 ms (Fig. 5: +10 ms only), not 20 ms (cascade)
    assert tolerates(model, zb_h2, 0, 10.0)
    assert not tolerates(model, zb_h2, 0, 20.0)
    assert tolerates(model.with_delays([20, 0, 0]), (8, 5, 3, 1), 0)
    assert not tolerates(model.with_delays([20, 0, 0]), zb_h2, 0)


def test_tolerance_heterogeneous_eq1() -> None:
    model = CostModel.uniform(2, 8, [4, 6], [8, 10], 1)
    # Eq. 1: 4 + 8 + 2c <= Δ (6 + 10)  ->  c <= (16Δ - 12) / 2
    assert tolerance_ms(model, (4, 1), 0) == pytest.approx((16 * 3 - 12) / 2)
    assert required_slackness(model, 0, 18.0) == 3  # (12 + 36) / 16 = 3
    assert required_slackness(model, 0, 18.5) == 4  # ceil, not the paper's floor
    assert required_slackness(model, 0, 0.0) == 1


def test_tolerance_bad_link() -> None:
    model = CostModel.uniform(3, 8, 1, 1, 1)
    with pytest.raises(ValueError, match="link must be in 0..1"):
        tolerance_ms(model, (3, 2, 1), 2)
    with pytest.raises(ValueError, match="needs 3 values"):
        tolerates(model, (3, 2), 0)


@pytest.mark.parametrize(
    ("stages", "n", "memory", "expected"),
    [
        (4, 12, 7, (7, 5, 3, 1)),  # = ZB-H2
        (4, 12, 100, (12, 8, 4, 1)),  # x_max capped at N; remainder to the first links (line 8)
        (5, 20, 10, (10, 7, 5, 3, 1)),  # Δ_avg = 2, r = 1
        (4, 12, 2, (2, 1, 1, 1)),  # less memory than stages: Δ = 0 is allowed (Lemma 1)
        (1, 5, 3, (1,)),  # one stage: nothing to be slack against, least memory
        (4, 12, [8, 3, 5, 5], (8, 3, 2, 1)),  # per-stage budgets: cap_i = min_{j<=i} M_j
    ],
)
def test_initial_warmup_alg1(stages: int, n: int, memory: object, expected: tuple[int, ...]) -> None:
    x = initial_warmup(stages, n, memory)  # type: ignore[arg-type]
    assert x == expected


def test_initial_warmup_maximises_min_slackness() -> None:
    for memory in range(4, 30):
        x = initial_warmup(4, 40, memory)
        deltas = [a - b for a, b in zip(x, x[1:])]
        assert x[0] == memory and x[-1] == 1
        assert max(deltas) - min(deltas) <= 1
        assert min(deltas) == (memory - 1) // 3


def test_initial_warmup_errors() -> None:
    with pytest.raises(ValueError, match="stages must be an integer >= 1"):
        initial_warmup(0, 4, 4)
    with pytest.raises(ValueError, match="memory M_1 = 0"):
        initial_warmup(2, 4, [3, 0])
    with pytest.raises(ValueError, match="memory needs 2 values"):
        initial_warmup(2, 4, [3])


def test_adapted_warmup_alg2() -> None:
    model = CostModel.uniform(4, 12, 10, 10, 10)
    assert adapted_warmup(model) == (7, 5, 3, 1)  # no delay: floor Δ = 2 (ZB-H2)
    assert adapted_warmup(model.with_delays([20, 0, 0])) == (8, 5, 3, 1)  # Δ_0 = (20+40)/20 = 3
    assert adapted_warmup(model.with_delays([0, 0, 25])) == (9, 7, 5, 1)  # ceil(3.5) = 4
    # Capped at N (the paper's N − 2S clip would give Δ <= -4 here), downstream slackness kept.
    small = CostModel.uniform(8, 8, 10, 10, 10, delays=[0, 0, 0, 0, 0, 0, 60])
    assert adapted_warmup(small) == (8, 8, 8, 8, 8, 8, 8, 1)
    # Memory budget honoured when given (None = offloaded, the paper's relaxed setting).
    assert adapted_warmup(model.with_delays([20, 0, 0]).with_memory(6)) == (6, 5, 3, 1)
    for x, tol_link in ((adapted_warmup(model.with_delays([0, 33, 0])), 1),):
        assert tolerates(model.with_delays([0, 33, 0]), x, tol_link)


def test_adapted_warmup_link_down() -> None:
    with pytest.raises(ValueError, match="link 1 is down"):
        adapted_warmup(CostModel.uniform(3, 8, 1, 1, 1, delays=[0, float("inf")]))


def test_uniform_warmup() -> None:
    assert uniform_warmup(4, 30, 3) == (10, 7, 4, 1)
    assert uniform_warmup(4, 5, 3) == (5, 5, 4, 1)
