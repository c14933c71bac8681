"""The closed-form lower bounds (timing.bounds.lower_bound_ms, timing.bounds.lower_bound_under) against true optima.

The optima come from a brute force written here (every valid per-rank order, timed by the
simulator, which runs fixed orders as early as possible, so the best order gives the best
schedule) and from the CP-SAT model solved WITHOUT the bounds as constraints: with them, a bound
that were too large would raise the "optimum" to itself and every check would pass.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence

import pytest

from titan_morph.pipelining.core.links import LinkModel, StaticDelays
from titan_morph.pipelining.core.model import CostModel, Op, Order
from titan_morph.pipelining.core.stragglers import RandomDelays, TraceDelays, TraceEvent
from titan_morph.pipelining.timing.bounds import lower_bound_ms, lower_bound_under
from titan_morph.pipelining.timing.simulate import DeadlockError, makespan

_EPS = 1e-9


def _rank_orders(model: CostModel, rank: int) -> list[Order]:
    """Every order of the rank's ops with F < I < W per (stage, microbatch) and at most M_r in flight."""
    named = model.stages_per_rank > 1
    chains = [(s, m) for s in model.rank_stages(rank) for m in range(model.microbatches)]
    cap, total = model.budget(rank), 3 * len(chains)
    out: list[Order] = []
    done = [0] * len(chains)  # ops of each chain already placed

    def extend(prefix: list[Op], live: int) -> None:
        if len(prefix) == total:
            out.append(tuple(prefix))
            return
        for c, (s, m) in enumerate(chains):
            k = done[c]
            if k == 3 or (k == 0 and live >= cap):
                continue
            done[c] += 1
            extend([*prefix, Op("FIW"[k], m, s if named else None)], live + (k == 0) - (k == 1))
            done[c] -= 1

    extend([], 0)
    return out


def brute_force(model: CostModel, limit: int = 60_000, **options: object) -> float:
    """Minimum simulated makespan over all combinations of valid per-rank orders."""
    per_rank = [_rank_orders(model, r) for r in range(model.ranks)]
    assert math.prod(len(p) for p in per_rank) <= limit, "instance too large for the brute force"
    best = math.inf
    for orders in itertools.product(*per_rank):
        try:
            best = min(best, makespan(model, orders, **options))
        except DeadlockError:  # e.g. both stages wait for a microbatch the other has not sent
            continue
    return best


def _random_model(rng: random.Random, stages: int, n: int, memory: Sequence[int] | None) -> CostModel:
    def times() -> tuple[float, ...]:
        return tuple(float(rng.randint(1, 12)) for _ in range(stages))

    delays = tuple(float(rng.choice((0, rng.randint(1, 25)))) for _ in range(stages - 1))
    return CostModel(stages, n, times(), times(), times(), delays, None if memory is None else tuple(memory))


def _tiny_models() -> list[CostModel]:
    """Random S = 2..3, N = 2..3 instances (loose and tight memory) small enough to enumerate."""
    rng = random.Random(2026)
    shapes: list[tuple[int, int, tuple[int, ...] | None]] = [
        (2, 2, None),
        (2, 2, None),
        (2, 2, (1, 1)),
        (2, 2, (2, 1)),
        (3, 2, None),
        (3, 2, (2, 1, 1)),
        (3, 2, (1, 2, 2)),
        (2, 3, (1, 1)),
        (2, 3, (1, 1)),
    ]
    return [_random_model(rng, s, n, mem) for s, n, mem in shapes]


# Hand-made instances on which the bound is attained (a 5 % larger "bound" must fail on them).
# One stage: everything is serial, N (F + I + W).
_SERIAL = CostModel.uniform(1, 3, 2.0, 3.0, 4.0)
# M = 1 on the last stage: waves of F then the round trip, the memory-wave bound (b).
_WAVES = CostModel.uniform(2, 2, 1.0, 2.0, 0.5, delays=4.0, memory=(2, 1))
# The last stage's long W dominates: head + F + I + W on stage 1.
_LAST_W = CostModel(2, 2, (3.0, 2.0), (2.0, 3.0), (1.0, 9.0), (5.0,))
TINY = [*_tiny_models(), _SERIAL, _WAVES, _LAST_W]


@pytest.mark.parametrize("idx", range(len(TINY)))
def test_static_bound_never_exceeds_the_brute_force_optimum(idx: int) -> None:
    model = TINY[idx]
    best = brute_force(model)
    assert math.isfinite(best)
    assert lower_bound_ms(model) <= best + _EPS, (model, lower_bound_ms(model), best)
    # under static links the time-varying bound is valid too
    assert lower_bound_under(model, StaticDelays(model.delays)) <= best + _EPS


def test_static_bound_is_attained_where_worked_by_hand() -> None:
    assert brute_force(_SERIAL) == pytest.approx(3 * 9.0) == pytest.approx(lower_bound_ms(_SERIAL))
    # N (F + I) on stage 1 with M = 1, plus F0 + c before and c + I0 + W0 after the last I
    waves = 2 * (1.0 + 2.0) + (1.0 + 4.0) + (4.0 + 2.0 + 0.5)
    assert brute_force(_WAVES) == pytest.approx(waves) == pytest.approx(lower_bound_ms(_WAVES))
    # F0 + c, then 2 (F + I + W) on stage 1
    assert brute_force(_LAST_W) == pytest.approx(3 + 5 + 2 * 14) == pytest.approx(lower_bound_ms(_LAST_W))


def test_exact_model_without_the_bound_agrees_with_the_brute_force() -> None:
    """CP-SAT with and without the closed-form constraints finds the brute force's optimum, so
    the bound neither cuts off the optimum nor is trusted by the model that checks it."""
    pytest.importorskip("ortools", reason="reference/exact.py needs OR-Tools (dev dependency)")
    from titan_morph.pipelining.reference.exact import optimal_makespan

    for model in TINY[:7] + [_WAVES, _LAST_W]:
        best = brute_force(model)
        free = optimal_makespan(model, time_limit_s=20, use_bound=False, use_default_hint=False)
        assert free.optimal, free.status
        assert free.makespan == pytest.approx(best)
        assert lower_bound_ms(model) <= free.makespan + _EPS
        bounded = optimal_makespan(model, time_limit_s=20)
        assert bounded.optimal, bounded.status
        assert bounded.makespan == pytest.approx(best)


def test_v_bound_never_exceeds_the_optimum() -> None:
    """Two stages per rank: one microbatch by brute force, more by CP-SAT without the bound."""
    # N = 1: the bound is one microbatch's round trip, attained when the W's of the other stages
    # fit beside it.
    one = CostModel(4, 1, (1.0, 2.0, 3.0, 1.0), (2.0, 1.0, 2.0, 3.0), (1.0, 1.0, 1.0, 2.0), (6.0,), stages_per_rank=2)
    assert brute_force(one) == pytest.approx(lower_bound_ms(one))
    uneven = CostModel(
        4, 1, (1.0, 2.0, 3.0, 1.0), (2.0, 1.0, 2.0, 3.0), (9.0, 1.0, 8.0, 2.0), (6.0,), stages_per_rank=2
    )
    assert lower_bound_ms(uneven) <= brute_force(uneven) + _EPS
    pytest.importorskip("ortools", reason="reference/exact.py needs OR-Tools (dev dependency)")
    from titan_morph.pipelining.reference.exact import optimal_makespan

    for model in (
        CostModel.uniform(4, 2, 5.0, 5.0, 5.0, delays=20.0, stages_per_rank=2),
        CostModel(4, 3, (2.0, 3.0, 1.0, 2.0), (3.0, 2.0, 2.0, 4.0), (1.0, 2.0, 3.0, 1.0), (4.0,), (4, 3), 2),
    ):
        free = optimal_makespan(model, time_limit_s=20, use_bound=False)
        assert free.optimal, free.status
        assert lower_bound_ms(model) <= free.makespan + _EPS


def _trace(num_links: int, rng: random.Random) -> TraceDelays:
    """Piecewise-constant delays that change within the iteration (up and down)."""
    events = [
        TraceEvent(float(at), link, float(rng.choice((0, rng.randint(1, 30)))))
        for link in range(num_links)
        for at in sorted(rng.sample(range(0, 80), 4))
    ]
    return TraceDelays(num_links, tuple(events), key="time_ms")


def _time_varying_cases() -> list[tuple[CostModel, LinkModel, float]]:
    rng = random.Random(7)
    cases: list[tuple[CostModel, LinkModel, float]] = []
    for model in TINY[:8]:
        cases.append((model, _trace(model.num_links, rng), float(rng.randint(0, 40))))
        cases.append((model, RandomDelays(model.num_links, 12.0, 8.0, (3.0, 9.0), seed=rng.randint(0, 99)), 100.0))
    return cases


CASES = _time_varying_cases()


@pytest.mark.parametrize("idx", range(len(CASES)))
def test_time_varying_bound_never_exceeds_the_brute_force_optimum(idx: int) -> None:
    model, links, t0 = CASES[idx]
    best = brute_force(model, links=links, t0=t0)
    assert math.isfinite(best)
    bound = lower_bound_under(model, links, t0=t0)
    assert bound <= best + _EPS, (bound, best)


def test_time_varying_bound_is_attained_where_worked_by_hand() -> None:
    """Link 0 takes 3 ms until t = 8 ms, then 30: F0 (1 ms) arrives at 4 ms, stage 1 runs F, I and
    its long W (20 ms), and stage 0's I0 and W0 (the gradient left at 6 ms) fit beside that W."""
    model = CostModel(2, 1, (1.0, 1.0), (1.0, 1.0), (1.0, 20.0), (0.0,))
    trace = TraceDelays(1, (TraceEvent(0.0, 0, 3.0), TraceEvent(8.0, 0, 30.0)), key="time_ms")
    best = brute_force(model, links=trace)
    assert best == pytest.approx(4 + 1 + 1 + 20)
    assert lower_bound_under(model, trace, resolution_ms=0.5) == pytest.approx(best)
    # one microbatch more on a static 3 ms link, late in the run: F0 + c, then 2 (F + I + W)
    model2 = CostModel(2, 2, (1.0, 1.0), (1.0, 1.0), (1.0, 20.0), (3.0,))
    best2 = brute_force(model2, links=StaticDelays((3.0,)), t0=50.0)
    assert best2 == pytest.approx(4 + 2 * 22)
    assert lower_bound_under(model2, StaticDelays((3.0,)), t0=50.0) == pytest.approx(best2)
    # a drop after the forward is ready: the simulator sends at once (arrives at 11 ms), the bound
    # allows holding the send until the drop (arrives at 2 ms, the grid may place it 0.5 ms early)
    drop = TraceDelays(1, (TraceEvent(0.0, 0, 10.0), TraceEvent(2.0, 0, 0.0)), key="time_ms")
    assert brute_force(model, links=drop) == pytest.approx(11 + 1 + 1 + 20)
    assert 2 + 22 - 0.5 - _EPS <= lower_bound_under(model, drop, resolution_ms=0.5) <= 2 + 22 + _EPS
