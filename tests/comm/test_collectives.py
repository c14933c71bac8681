"""The DP collective emulator (``titan_morph.comm.emulator.collectives``) on real gloo ranks.

A collective whose ring crosses a slow host pair really completes later, by its ring steps x the
pair's delay, with correct results; collectives of one group complete in issue order; a group
whose ring avoids the pair is not slowed; the records carry what the monitor needs.
"""

from __future__ import annotations

import time

import pytest

from tests.launch import run_ranks
from titan_morph.comm.emulator.collectives import PairDelays, ring_pairs, ring_steps

DELAY_MS = 40.0


def test_ring_model():
    assert ring_pairs([0, 1]) == [(0, 1)]
    assert ring_pairs([3, 1, 2]) == [(1, 3), (1, 2), (2, 3)]
    assert ring_pairs([5]) == []
    assert [ring_steps(op, 4) for op in ("allreduce", "allgather", "reduce_scatter", "recv", "send")] == [6, 3, 3, 1, 0]
    with pytest.raises(ValueError, match="unknown collective"):
        ring_steps("bogus", 2)


def test_pair_delays_window_and_symmetry():
    model = PairDelays({(1, 0): 30.0}, start_step=3, end_step=5)
    assert model.delays == {(0, 1): 30.0}
    assert [model.delay_ms(0, 1, s) for s in (2, 3, 5, 6)] == [0.0, 30.0, 30.0, 0.0]
    assert model.delay_ms(1, 0, 4) == 30.0 and model.delay_ms(0, 2, 4) == 0.0
    with pytest.raises(ValueError, match="two different hosts"):
        PairDelays({(2, 2): 1.0})
    with pytest.raises(ValueError, match="finite"):
        PairDelays({(0, 1): float("inf")})


def _timed(fn) -> float:
    t0 = time.monotonic()
    fn()
    return (time.monotonic() - t0) * 1e3


def _slow_pair(rank: int, world: int, hosts: list[int]) -> dict:
    import torch
    import torch.distributed as dist

    from titan_morph.comm.emulator import collectives

    collectives.register()
    collectives.configure(hosts, PairDelays({(0, 1): DELAY_MS}))
    collectives.set_step(1)
    # every rank creates every group (torch's rule); hosts 0 and 1 are the slow pair
    pairs = [dist.new_group([0, 1], backend=collectives.BACKEND), dist.new_group([2, 3], backend=collectives.BACKEND)]
    trio = dist.new_group([0, 2, 1], backend=collectives.BACKEND)
    mine = pairs[rank // 2]
    out: dict = {"group": dist.get_process_group_ranks(mine)}
    x = torch.full((4,), float(rank + 1))
    out["allreduce_ms"] = _timed(lambda: dist.all_reduce(x, group=mine))
    out["allreduce"] = x.tolist()
    gathered = torch.empty(8)
    out["allgather_ms"] = _timed(
        lambda: dist.all_gather_into_tensor(gathered, torch.full((4,), float(rank)), group=mine)
    )
    out["allgather"] = gathered.tolist()
    part = torch.empty(2)
    out["reduce_scatter_ms"] = _timed(lambda: dist.reduce_scatter_tensor(part, torch.arange(4.0), group=mine))
    out["reduce_scatter"] = part.tolist()
    # two async all-gathers issued back to back complete one after the other
    a, b = torch.empty(2), torch.empty(2)
    t0 = time.monotonic()
    w1 = dist.all_gather_into_tensor(a, torch.ones(1), group=mine, async_op=True)
    w2 = dist.all_gather_into_tensor(b, torch.ones(1), group=mine, async_op=True)
    w1.wait()
    first = (time.monotonic() - t0) * 1e3
    w2.wait()
    out["fifo_ms"] = (first, (time.monotonic() - t0) * 1e3)
    if rank != 3:  # a ring over three ranks whose pair (0,1) is slow, or (after a move) is not
        y = torch.ones(1)
        out["trio_allreduce_ms"] = _timed(lambda: dist.all_reduce(y, group=trio))
        out["trio"] = y.item()
    collectives.set_step(0)  # outside the emulated window (start_step 1): no delay
    out["outside_ms"] = _timed(lambda: dist.all_reduce(torch.ones(1), group=mine))
    out["records"] = [(r.op, r.steps, r.seq, r.delay_ms, r.ranks, r.status) for r in collectives.take_records()]
    return out


def test_a_collective_over_the_slow_pair_completes_later():
    res = run_ranks(_slow_pair, 4, [0, 1, 2, 3], timeout=90)
    slow, fast = res[0], res[2]
    # results are the real collectives' results
    assert res[0]["allreduce"] == res[1]["allreduce"] == [3.0] * 4
    assert res[2]["allreduce"] == [7.0] * 4
    assert res[0]["allgather"] == [0.0] * 4 + [1.0] * 4
    assert res[0]["reduce_scatter"] == [0.0, 2.0] and res[1]["reduce_scatter"] == [4.0, 6.0]
    # the slow pair's group: an all-reduce takes 2 ring steps, an all-gather/reduce-scatter one
    for r in (slow, res[1]):
        assert r["allreduce_ms"] >= 2 * DELAY_MS
        assert r["allgather_ms"] >= DELAY_MS and r["reduce_scatter_ms"] >= DELAY_MS
        first, second = r["fifo_ms"]
        assert first >= DELAY_MS and second >= 2 * DELAY_MS  # in issue order on the group's stream
        assert r["outside_ms"] < DELAY_MS
    # the healthy group is not slowed
    for r in (fast, res[3]):
        assert r["allreduce_ms"] < DELAY_MS and r["allgather_ms"] < DELAY_MS and max(r["fifo_ms"]) < DELAY_MS
    # a three-rank ring through the slow pair: 2 x (3 - 1) ring steps of the slowest pair
    assert all(res[r]["trio"] == 3.0 and res[r]["trio_allreduce_ms"] >= 4 * DELAY_MS for r in (0, 1, 2))
    ops = [(op, steps, delay) for op, steps, _, delay, ranks, status in slow["records"] if ranks == (0, 1)]
    assert ops[:3] == [("allreduce", 2, DELAY_MS), ("allgather", 1, DELAY_MS), ("reduce_scatter", 1, DELAY_MS)]
    assert ops[-1] == ("allreduce", 2, 0.0)
    assert all(status == "done" for *_, status in slow["records"])
    seqs = [seq for _, _, seq, _, ranks, _ in slow["records"] if ranks == (0, 1)]
    assert seqs == list(range(len(seqs)))


def test_hosts_follow_the_rank_order():
    """Ranks 1 and 2 run on hosts 2 and 1: the slow host pair 0-1 is now ranks 0 and 2."""
    res = run_ranks(_slow_pair, 4, [0, 2, 1, 3], timeout=90)
    assert all(r["allreduce_ms"] < DELAY_MS for r in res)  # groups {0,1} and {2,3} hold no slow pair
    assert all(res[r]["trio_allreduce_ms"] >= 4 * DELAY_MS for r in (0, 1, 2))  # the ring 0-2-1 does
