"""Microbatches moved between DP replicas (pure): the split by speed against brute force, relative
speeds per stage, the rebalancer's hysteresis (no straggler: no move over 100 noisy steps; a slow
rank: a move after ``detect_steps``, back to even after ``recover_steps``), and the monitor's plan
for another N."""

from __future__ import annotations

import itertools
import random

import pytest

from titan_morph.monitor.adapt import Monitor
from titan_morph.monitor.detect import DetectRule
from titan_morph.monitor.rebalance import Rebalancer, even_counts, pace, relative_speeds, split_by_speed
from titan_morph.pipelining.core.model import CostModel
from titan_morph.pipelining.search.builders import build

RULE = DetectRule(detect_steps=3, recover_steps=3)


def _brute(speeds: tuple[float, ...], total: int, cap: int) -> float:
    splits = (c for c in itertools.product(range(1, cap + 1), repeat=len(speeds)) if sum(c) == total)
    return min(pace(c, speeds) for c in splits)


@pytest.mark.parametrize("seed", range(40))
def test_split_by_speed_is_the_least_pace_of_all_splits(seed):
    rng = random.Random(seed)
    replicas = rng.choice((2, 3, 4))
    n = rng.randint(1, 6)
    total, cap = replicas * n, rng.randint(n, 2 * n)
    speeds = tuple(rng.choice((1.0, 0.5, 0.67, 0.8, rng.uniform(0.2, 1.0))) for _ in range(replicas))
    counts = split_by_speed(speeds, total, cap)
    assert sum(counts) == total and all(1 <= c <= cap for c in counts), counts
    assert pace(counts, speeds) == pytest.approx(_brute(speeds, total, cap)), (speeds, total, cap, counts)


def test_split_by_speed_examples_and_errors():
    assert split_by_speed((1.0, 1.0), 16, 16) == (8, 8)  # equal speeds: the even split back
    assert split_by_speed((0.5, 1.0), 16, 16) == (5, 11)  # the limit: paced at 11 instead of 16
    assert split_by_speed((0.5, 1.0), 16, 10) == (6, 10)  # at most cap on the fast replica
    assert split_by_speed((0.01, 1.0), 4, 3) == (1, 3)  # at least one each
    assert even_counts(3, 4) == (4, 4, 4)
    with pytest.raises(ValueError, match="cannot give 2 replicas 1..3 each"):
        split_by_speed((1.0, 1.0), 8, 3)
    with pytest.raises(ValueError, match="speeds must be > 0"):
        split_by_speed((0.0, 1.0), 4, 3)


def test_relative_speeds_compare_each_stage_across_replicas():
    # rank r: stage r // 2 of replica r % 2 (TorchTitan's order, pp outermost)
    speeds = relative_speeds([10.0, 10.0, 30.0, 15.0], stages=2, replicas=2)
    assert speeds == [1.0, 1.0, 0.5, 1.0]
    assert relative_speeds([None, 10.0, 20.0, 20.0], 2, 2) == [None, 1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="3 op times for 2 stages x 2 replicas"):
        relative_speeds([1.0, 1.0, 1.0], 2, 2)


def _op_ms(rng: random.Random, slow: dict[int, float], noise: float = 0.03) -> list[float | None]:
    return [30.0 * slow.get(r, 1.0) * rng.uniform(1 - noise, 1 + noise) for r in range(4)]


def test_no_straggler_never_rebalances_over_100_noisy_steps():
    rng = random.Random(7)
    reb = Rebalancer(2, 2, 8, cap=16, rule=DetectRule())
    decisions = [reb.observe(step, _op_ms(rng, {})) for step in range(1, 101)]
    assert decisions == [None] * 100 and reb.rebalances == 0 and reb.counts == (8, 8)
    assert reb.metrics()["morph/microbatches/replica1"] == 8.0 and reb.metrics()["morph/rebalances"] == 0.0


def test_a_slow_rank_moves_microbatches_after_detect_steps_and_back_after_recovery():
    rng = random.Random(3)
    reb = Rebalancer(2, 2, 8, cap=16, rule=RULE)
    made = {}
    for step in range(1, 31):
        slow = {3: 2.0} if 5 <= step <= 14 else {}  # rank 3: stage 1 of replica 1, twice as slow
        decision = reb.observe(step, _op_ms(rng, slow))
        if decision is not None:
            made[step] = decision
    assert sorted(made) == [7, 17], made  # slow 5, 6, 7 -> after 7; healthy 15, 16, 17 -> after 17
    first, back = made[7], made[17]
    assert first.before == (8, 8) and first.counts == (11, 5) and first.speeds[0] == 1.0
    assert 0.45 <= first.speeds[1] <= 0.55
    assert "microbatches per replica [8, 8] -> [11, 5] (global batch 16 unchanged" in first.describe()
    assert back.counts == (8, 8) and back.speeds == (1.0, 1.0)
    assert reb.rebalances == 2


def test_one_noisy_step_moves_nothing_and_the_start_up_step_is_not_measured():
    reb = Rebalancer(2, 2, 8, cap=16, rule=RULE)
    assert reb.observe(1, [30.0, 30.0, 30.0, 300.0]) is None  # start-up: not measured
    assert reb.measured == [None] * 4
    for step in range(2, 20):
        slow = {1: 3.0} if step in (5, 9, 10) else {}  # never 3 in a row
        assert reb.observe(step, _op_ms(random.Random(step), slow)) is None
    assert reb.counts == (8, 8)


def test_rebalancer_refuses_a_split_of_another_batch():
    with pytest.raises(ValueError, match="is not a split of 16 over 2 replicas"):
        Rebalancer(2, 2, 8, cap=16, counts=(8, 7))
    assert Rebalancer(2, 2, 8, cap=16, counts=(6, 10)).counts == (6, 10)


def test_monitor_resize_plans_for_the_new_count():
    model = CostModel.uniform(2, 8, 1.0, 1.0, 1.0)
    plan = build("pipemorph", model)
    times = ((1.0, 1.0, 1.0),) * 2
    monitor = Monitor(
        num_stages=2,
        microbatches=8,
        initial_plan=plan,
        fallback_times=times,
        plan_for=lambda n: build("pipemorph", CostModel.uniform(2, n, 1.0, 1.0, 1.0)),
    )
    five = monitor.resize(5)
    assert five.model.microbatches == 5 and monitor.microbatches == 5
    assert monitor.resize(8).orders == plan.orders
    fixed = Monitor(num_stages=2, microbatches=8, initial_plan=plan, fallback_times=times)
    with pytest.raises(ValueError, match="plans for N = 8 only, not 5"):
        fixed.resize(5)
