"""The orchestrator's pure parts: layouts, the assignment search, DP stamps and pair detection."""

from __future__ import annotations

import itertools
import math

import pytest

from titan_morph.monitor.detect import DetectRule
from titan_morph.monitor.topology import (
    CollectiveStamp,
    Layout,
    TopologyMonitor,
    best_layout,
    decode_stamps,
    encode_stamps,
    estimate_pairs,
    score,
)


def test_layout_follows_torchtitans_rank_order():
    lay = Layout.identity(2, 2)
    assert lay.dp_group(0) == (0, 1) and lay.dp_group(1) == (2, 3)
    assert lay.pipeline(0) == (0, 2) and lay.pipeline(1) == (1, 3)
    assert lay.position(3) == (1, 1) and lay.rank(1, 0) == 2
    assert lay.where(0, 1) == "stage 0's DP group"
    assert lay.where(0, 2) == "link 0 of pipeline 0"
    assert lay.where(0, 3) == "no traffic"
    assert lay.host_pairs_of_dp() == [(0, 1), (2, 3)]
    assert lay.describe() == "[[0, 1], [2, 3]]"
    with pytest.raises(ValueError, match="once each"):
        Layout(2, 2, (0, 1, 1, 3))


def _moves_exist(current: Layout, slow: dict) -> bool:
    """Brute force: is there any layout with no slow pair inside a DP group?"""
    for perm in itertools.permutations(current.hosts):
        lay = Layout(current.stages, current.replicas, perm)
        if score(lay, slow, "any", lambda d: 0.0, current).dp_delay_ms == 0:
            return True
    return False


GRIDS = [(2, 2), (2, 3), (3, 2), (4, 2), (2, 4), (1, 4)]


@pytest.mark.parametrize("policy", ["pp", "any"])
@pytest.mark.parametrize("stages, replicas", GRIDS)
def test_the_slow_pair_never_stays_in_a_dp_group_when_a_move_exists(stages, replicas, policy):
    current = Layout.identity(stages, replicas)
    for a, b in itertools.combinations(range(stages * replicas), 2):
        slow = {(a, b): 30.0}
        new = best_layout(current, slow, policy=policy)
        in_dp = score(new, slow, policy, lambda d: 0.0, current).dp_delay_ms
        if _moves_exist(current, slow):
            assert in_dp == 0, f"{stages}x{replicas} {policy}: pair {a}-{b} left in a DP group: {new.describe()}"
        else:
            assert new == current  # nothing better: no move (e.g. PP = 1)
        if not current.where(a, b).endswith("DP group"):  # a pipeline link, or no traffic
            before = score(current, slow, policy, lambda d: sum(d), current)
            after = score(new, slow, policy, lambda d: sum(d), current)
            assert (after.off_pipeline, after.pipeline_ms) <= (before.off_pipeline, before.pipeline_ms)
            if policy == "pp":  # all links cost alike here: it stays where it is
                assert new == current, f"pair {a}-{b} carries no DP traffic: nothing to move"


def test_two_slow_pairs_sharing_a_host():
    current = Layout.identity(3, 3)
    slow = {(0, 1): 30.0, (1, 2): 20.0, (4, 5): 10.0}
    new = best_layout(current, slow, policy="pp")
    assert score(new, slow, "pp", lambda d: 0.0, current).dp_delay_ms == 0
    assert all(new.where(a, b).startswith("link") for a, b in slow), new.describe()


def test_policies_place_the_pair_on_a_pipeline_link_or_off_all_traffic():
    current = Layout.identity(2, 2)  # pair 0-1 is stage 0's DP group
    pp = best_layout(current, {(0, 1): 30.0}, policy="pp")
    assert pp.hosts == (0, 2, 1, 3)  # two hosts swap; 0-1 is pipeline 0's link
    assert pp.where(0, 1) == "link 0 of pipeline 0"
    anywhere = best_layout(current, {(0, 1): 30.0}, policy="any")
    assert anywhere.hosts == (0, 3, 2, 1)  # a diagonal of the 2 x 2 grid: no traffic at all
    assert anywhere.where(0, 1) == "no traffic"


def test_fewest_hosts_moved():
    current = Layout.identity(4, 4)
    new = best_layout(current, {(5, 6): 30.0}, policy="pp")
    assert sum(x != y for x, y in zip(new.hosts, current.hosts)) == 2
    assert new.where(5, 6).startswith("link")


def test_the_pipeline_cost_picks_the_link_with_more_slack():
    """With a cost that charges a delay more the later its link (less slackness, §7.2), the pair goes
    to the first link of a pipeline."""
    current = Layout.identity(4, 2)

    def later_is_worse(delays: tuple[float, ...]) -> float:
        return sum(d * (i + 1) for i, d in enumerate(delays))

    new = best_layout(current, {(6, 7): 30.0}, policy="pp", cost=later_is_worse)
    assert new.where(6, 7).startswith("link 0 "), new.describe()
    flat = best_layout(current, {(6, 7): 30.0}, policy="pp")  # the default cost: any link, fewest moves
    assert flat.where(6, 7).startswith("link 2 "), flat.describe()


def test_large_worlds_are_searched_pair_by_pair():
    current = Layout.identity(8, 8)  # 64 hosts: 64 x 63 x 62 x 61 placements are too many
    slow = {(0, 1): 30.0, (9, 10): 20.0}
    new = best_layout(current, slow, policy="pp")
    assert score(new, slow, "pp", lambda d: 0.0, current).dp_delay_ms == 0


def test_stamps_round_trip_and_overflow():
    stamps = [CollectiveStamp((0, 1), 0, i, 1, 10.0 * i, 10.0 * i + 3, -1) for i in range(5)]
    stamps.append(CollectiveStamp((2, 5, 7), 1, 0, 1, 1.5, math.nan, 7))
    got, dropped = decode_stamps(encode_stamps(stamps, 4))
    assert dropped == 2 and got == stamps[-4:][:3] + [got[3]]
    assert got[3].group == (2, 5, 7) and got[3].peer == 7 and math.isnan(got[3].end_ms)
    with pytest.raises(ValueError, match="ranks above"):
        encode_stamps([CollectiveStamp((0, 60), 0, 0, 1, 0.0, 1.0)], 2)


def _step_stamps(delay: float, seq0: int, n: int = 3) -> list[list[CollectiveStamp]]:
    """What ranks 0..3 of a 2 x 2 job report: stage 0's group (ranks 0, 1) sees ``delay`` per hop on
    its all-gathers (1 step) and all-reduces (2 steps); stage 1's group none."""
    rows: list[list[CollectiveStamp]] = [[] for _ in range(4)]
    for i in range(n):
        for group, d in (((0, 1), delay), ((2, 3), 0.2)):
            steps = 1 + i % 2
            for rank, late in zip(group, (0.0, 0.4)):
                rows[rank].append(
                    CollectiveStamp(group, 0, seq0 + i, steps, 100.0 * i + late, 100.0 * i + 0.5 + steps * d)
                )
    return rows


def test_pair_estimates_from_two_rank_groups():
    pairs, medians = estimate_pairs(_step_stamps(30.0, 0), Layout.identity(2, 2))
    assert set(pairs) == {(0, 1), (2, 3)}
    assert all(x == pytest.approx(30.0 + 0.1 / s, abs=0.1) for x, s in zip(pairs[(0, 1)].exact, (1, 2, 1)))
    assert medians[0] == pytest.approx(30.05, abs=0.1) and medians[1] < 1
    # after a move the same host pair is found under its new ranks
    moved = Layout(2, 2, (0, 2, 1, 3))
    pairs, _ = estimate_pairs(_step_stamps(30.0, 0), moved)
    assert set(pairs) == {(0, 2), (1, 3)}


def test_monitor_needs_k_consecutive_slow_steps_then_moves_once():
    rule = DetectRule(detect_steps=3, floor_ms=5.0)
    mon = TopologyMonitor(Layout.identity(2, 2), rule, policy="pp")
    seq = 0
    plan = [30.0, 30.0, 2.0, 30.0, 30.0, 30.0, 30.0]  # a healthy step resets the count
    moves = []
    for step, delay in enumerate(plan, 1):
        moves.append(mon.observe(step, _step_stamps(delay, seq)))
        seq += 3
    assert [m is not None for m in moves] == [False] * 5 + [True, False]  # once, after steps 4, 5, 6
    move = moves[5]
    assert move.step == 6 and move.new.hosts == (0, 2, 1, 3) and move.slow == {(0, 1): 35.0}
    text = move.describe()
    assert "DP pair 0-1 (stage 0's DP group) slow" in text and "[[0, 1], [2, 3]] -> [[0, 2], [1, 3]]" in text
    assert mon.metrics()["morph/dp_straggling/pair0-1"] == 1.0


def test_monitor_floor_and_policy_off():
    quiet = TopologyMonitor(Layout.identity(2, 2), DetectRule(detect_steps=1, floor_ms=5.0), policy="any")
    assert quiet.observe(1, _step_stamps(4.0, 0)) is None  # under the floor: never slow
    off = TopologyMonitor(Layout.identity(2, 2), DetectRule(detect_steps=1, floor_ms=5.0), policy="off")
    assert off.observe(1, _step_stamps(30.0, 0)) is None and off.detector.links[0].slow


def test_probes_tell_the_pairs_of_a_larger_group_apart():
    """A 3-rank DP group: its collectives only say the ring is slow; probe messages name the pair."""
    lay = Layout.identity(1, 3)
    mon = TopologyMonitor(lay, DetectRule(detect_steps=2, floor_ms=5.0), policy="off")
    ring = (0, 1, 2)
    slow_ring = [[CollectiveStamp(ring, 0, 0, 4, 0.0, 0.2 + 4 * 30.0)] for _ in range(3)]
    mon.observe(1, slow_ring)
    assert mon.suspects() == [ring] and not mon.estimates
    # ring probes: rank i sends to i+1; the message 0 -> 1 crosses the slow pair
    rows: list[list[CollectiveStamp]] = [[] for _ in range(3)]
    for src in range(3):
        dst = (src + 1) % 3
        rows[src].append(CollectiveStamp(ring, 0, 0, 0, 10.0, 10.1, dst))
        late = 30.0 if {src, dst} == {0, 1} else 0.3
        rows[dst].append(CollectiveStamp(ring, 0, 0, 1, 10.0, 10.0 + late, src))
    mon.observe(2, rows)
    assert mon.estimates[(0, 1)].exact == [pytest.approx(30.0)]
    assert mon.estimates[(1, 2)].exact == [pytest.approx(0.3)]


def test_the_scheduler_is_told_of_a_pair_moved_onto_its_link():
    """After a move the relaunched pipeline plans for the measured delay at once (Fig. 13 step 5)."""
    from titan_morph.monitor.adapt import AdaptPolicy, Monitor
    from titan_morph.pipelining.core.model import CostModel
    from titan_morph.pipelining.search.builders import build

    model = CostModel(2, 8, (10.0, 10.0), (10.0, 10.0), (10.0, 10.0), memory=2)
    initial = build("pipemorph", model)

    def monitor(enabled: bool) -> Monitor:
        policy = AdaptPolicy(enabled=enabled, memory=None, depth=None, delegate_slow_links=True)
        return Monitor(
            num_stages=2, microbatches=8, initial_plan=initial, fallback_times=[(10.0, 10.0, 10.0)] * 2, policy=policy
        )

    told = monitor(True)
    change = told.assume_slow((35.0,), "moved here")
    assert change is not None and change.switch == (0,) and change.delays_ms == (35.0,)
    assert change.plan.warmup[0] > initial.warmup[0]  # more slack on the slow link (Alg. 2)
    assert told.detector.links[0].slow and told.detector.links[0].planned_ms == 35.0
    assert "link 0 slow: moved here; planning for 35 ms" in change.reasons[0]
    assert told.assume_slow((0.0,), "nothing") is None
    assert monitor(False).assume_slow((35.0,), "adaptation off") is None
