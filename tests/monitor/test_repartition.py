"""partition = "auto"'s decisions (pure): per-layer costs from the baseline, per-rank speeds, the
speed detector's hysteresis, the re-plan for measured speeds, the ski rental and the carried state."""

from __future__ import annotations

import pytest

from titan_morph.monitor.adapt import AdaptPolicy, Monitor
from titan_morph.monitor.compute import SpeedDetector, rank_speeds, spread_costs
from titan_morph.monitor.detect import DetectRule
from titan_morph.monitor.profile import StepProfile
from titan_morph.monitor.repartition import (
    Entries,
    Partitioner,
    PartitionState,
    RelaunchParts,
    entries_of,
    layers_of,
)
from titan_morph.pipelining.core.model import CostModel
from titan_morph.pipelining.partition import LayerCost
from titan_morph.pipelining.search.builders import build

S, N, LAYERS, T = 4, 24, 16, 2.5
RULE = DetectRule(detect_steps=3, recover_steps=3)
EVEN = entries_of((4, 4, 4, 4))


def _entries() -> Entries:
    zero = (0.0, 0.0, 0.0)
    weights = (zero, *[(T, T, T)] * LAYERS, zero)
    names = ("tok_embeddings", *(f"layers.{i}" for i in range(LAYERS)), "output")
    return Entries(names, weights, ((0.0, 0.0),) * (LAYERS + 2))


def _profiles(step: int, split: tuple[int, ...], factors: tuple[float, ...]) -> list[StepProfile]:
    """One step: stage s runs its layers' F, I, W (T ms each per layer) x its rank's factor."""
    out = []
    for s, (n, f) in enumerate(zip(layers_of(split), factors)):
        t = n * T * f
        out.append(StepProfile(s, step, 0.0, 1000.0, {"F": (t * N, N), "I": (t * N, N), "W": (t * N, N)}))
    return out


def _partitioner(**kw) -> Partitioner:
    kw.setdefault("rule", RULE)
    return Partitioner(_entries(), EVEN, N, "pipemorph", kw.pop("steps", 200), **kw)


def test_layers_and_entries_round_trip():
    assert entries_of((5, 5, 4, 2)) == (6, 5, 4, 3) and layers_of((6, 5, 4, 3)) == (5, 5, 4, 2)


def test_costs_spread_by_weight_and_speed_of_a_rank_is_its_layers_over_its_time():
    names = ("e", "a", "b", "o")
    weights = ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0), (3.0, 3.0, 1.0), (1.0, 2.0, 0.0))
    costs = spread_costs(names, weights, (2, 2), ((8.0, 8.0, 4.0), (10.0, 6.0, 2.0)))
    assert [c.fwd for c in costs] == [0.0, 8.0, 7.5, 2.5] and [c.wgt for c in costs] == [0.0, 4.0, 2.0, 0.0]
    profiles = _profiles(1, EVEN, (1.0, 1.0, 1.0, 2.0))
    uniform = tuple(
        LayerCost(n, T if 0 < i <= LAYERS else 0, T if 0 < i <= LAYERS else 0, 0)
        for i, n in enumerate(_entries().names)
    )
    speeds = rank_speeds(profiles, uniform, EVEN)
    assert speeds == pytest.approx([2 / 3, 2 / 3, 2 / 3, 1 / 3])  # F + I per layer predicted, F + I + W measured


def test_detector_hysteresis_slow_then_recovered():
    det = SpeedDetector(2, RULE)
    decisions = {}
    for step, speed in enumerate([1.0, 0.5, 0.5, 0.5, 0.5, 1.0, 0.97, 1.0], start=1):
        got = det.update(step, [1.0, speed])
        if got is not None:
            decisions[step] = got
    assert sorted(decisions) == [4, 8]
    assert decisions[4].speeds == (1.0, 0.5) and decisions[4].newly_slow == (1,)
    assert decisions[8].recovered == (1,) and decisions[8].speeds == (1.0, 1.0)
    assert "rank 1 slow: op time 2.00x its baseline" in decisions[4].reasons[0]


def test_a_rank_back_at_its_baseline_is_planned_at_speed_1_before_it_recovers():
    det = SpeedDetector(2, DetectRule(detect_steps=2, recover_steps=4))
    decisions = {}
    for step, speed in enumerate([0.5, 0.5, 0.7, 0.7, 1.0, 0.99, 1.0, 1.0], start=1):
        got = det.update(step, [1.0, speed])
        if got is not None:
            decisions[step] = got
    assert sorted(decisions) == [2, 4, 6, 8], decisions
    assert decisions[4].speeds == (1.0, 0.7) and "faster" in decisions[4].reasons[0]
    # k steps back at the baseline: planned at 1, still reported slow; recovered after m
    assert decisions[6].speeds == (1.0, 1.0) and decisions[6].slow_ranks == (1,)
    assert "at its baseline" in decisions[6].reasons[0]
    assert decisions[8].recovered == (1,) and decisions[8].slow_ranks == ()


def test_replans_at_detection_then_moves_once_the_lost_time_pays_the_relaunch():
    part = _partitioner()
    plans = {}
    for step in range(1, 40):
        factors = (1.0, 1.0, 1.0, 2.0 if step >= 4 else 1.0)
        got = part.observe(step, _profiles(step, EVEN, factors), (0.0, 0.0, 0.0))
        if step == 1:
            # a first launch: 3 s to its first step's end beyond one planned step (750 ms); a relaunch
            # adds a save, a load and the end of the run: 5 s in all
            part.set_startup(3000.0 + 750.0, RelaunchParts(save_ms=1200.0, load_ms=500.0, end_ms=300.0))
        if got is not None:
            plans[step] = got
        if part.repartition is not None:
            break
    assert sorted(plans) == [3, 6], plans  # the baseline (steps 2-3), the detection (steps 4-6)
    assert "stage times measured over 2 steps" in plans[3][1] and "rank 3 slow" in plans[6][1]
    assert "layers per stage [5, 5, 4, 2] would plan 912.5 ms" in plans[6][1]
    assert part.relaunch_cost_ms == pytest.approx(5000.0)
    priced = [n for n in part.notes if n.startswith("relaunch cost")]
    assert priced == [
        "relaunch cost 5.0 s (estimated): 3.8 s from the launch to the end of its first step, less one planned"
        " step (0.8 s), plus the checkpoint's save 1.2 s and load 0.5 s (probed) and the end of the run 0.3 s"
    ]
    move = part.repartition
    assert move is not None and layers_of(move.entries) == (5, 5, 4, 2)
    # from step 6 on every step loses 1470 - 912.5 ms: 9 steps exceed 5 s
    assert move.step == 14 and move.lost_ms == pytest.approx(9 * 557.5) and move.current_ms == pytest.approx(1470.0)
    state = PartitionState.from_json(part.state(123.0).to_json())
    assert state.speeds == (1.0, 1.0, 1.0, 0.5) and state.repartitions == 1 and state.decided_at == 123.0
    assert state.costs[1].fwd == pytest.approx(T) and state.costs[0].fwd == 0.0


def test_a_move_that_cannot_pay_back_is_not_made():
    part = _partitioner(steps=12)
    for step in range(1, 12):
        part.observe(step, _profiles(step, EVEN, (1.0, 1.0, 1.0, 2.0 if step >= 4 else 1.0)), (0.0, 0.0, 0.0))
        if step == 1:
            part.set_startup(60_000.0)
    assert part.repartition is None and any("cannot pay back" in n for n in part.notes)


def test_relaunched_run_plans_for_the_carried_speeds_and_moves_back_on_recovery():
    moved = entries_of((5, 5, 4, 2))
    costs = spread_costs(_entries().names, _entries().weights, EVEN, [(10.0, 10.0, 10.0)] * S)
    carried = PartitionState(costs, (1.0, 1.0, 1.0, 0.5), 1, 4000.0, 0.0)
    part = Partitioner(_entries(), moved, N, "pipemorph", 200, rule=RULE, after=0.0, carried=carried)
    part.set_startup(5000.0 + 912.5, RelaunchParts(1.0, 1.0, 1.0))  # measured whole: no parts added
    first = part.observe(21, _profiles(21, moved, (1.0, 1.0, 1.0, 2.0)), (0.0, 0.0, 0.0))
    assert first is not None and "from before the relaunch" in first[1] and part.plan_ms == pytest.approx(912.5)
    assert part.relaunch_cost_ms == pytest.approx(5000.0)
    assert "relaunch cost 5.0 s (measured): 5.9 s from the re-partition's decision" in part.notes[-1]
    assert part.notes[-1].endswith("; the move was priced at 4.0 s (1.25x)")
    for step in range(22, 30):  # still slow: consistent with the carried speed, nothing to do
        assert part.observe(step, _profiles(step, moved, (1.0, 1.0, 1.0, 2.0)), (0.0, 0.0, 0.0)) is None
    for step in range(30, 34):  # recovered
        part.observe(step, _profiles(step, moved, (1.0,) * S), (0.0, 0.0, 0.0))
    assert part.repartition is not None and layers_of(part.repartition.entries) == (4, 4, 4, 4)
    assert part.repartitions == 1 and part.metrics()["morph/partition/stage3"] == 2.0


def test_monitor_installs_the_partitioners_plans():
    initial = build("pipemorph", CostModel.uniform(S, N, 10.0, 10.0, 10.0, memory=S))
    mon = Monitor(
        num_stages=S,
        microbatches=N,
        initial_plan=initial,
        fallback_times=((10.0,) * 3,) * S,
        rule=RULE,
        policy=AdaptPolicy(),
    )
    mon.partitioner = _partitioner()
    changes = {}
    for step in range(1, 8):
        change = mon.observe(step, _profiles(step, EVEN, (1.0, 1.0, 1.0, 2.0 if step >= 4 else 1.0)), initial)
        if change is not None:
            changes[step] = change
    assert sorted(changes) == [3, 6]
    assert changes[6].plan.model.fwd == pytest.approx((10.0, 10.0, 10.0, 20.0))
    assert mon.metrics(frozenset())["morph/slow_rank/rank3"] == 1.0


def test_another_ranks_decision_keeps_the_time_already_lost():
    part = _partitioner()
    lost = {}
    for step in range(1, 80):
        factors = (1.0, 1.0, 1.0 if step < 9 else 1.5, 2.0 if step >= 4 else 1.0)
        part.observe(step, _profiles(step, EVEN, factors), (0.0, 0.0, 0.0))
        if step == 1:
            part.set_startup(8000.0 + 750.0)  # a price that takes many steps of rent
        metrics = part.metrics()
        if "morph/partition_lost_ms" in metrics:
            lost[step] = metrics["morph/partition_lost_ms"]
        if part.repartition is not None:
            break
    # rank 3 slow from step 6 (its rent runs), rank 2 slow from step 11: the rent paid stays paid
    assert lost[10] > 0 and lost[11] > lost[10] and all(lost[s + 1] > lost[s] for s in range(6, max(lost)))
    assert part.repartition is not None and part.repartition.since == 6
