"""The world-wide per-step exchange of DP x PP on real gloo ranks: every rank's DP collective
stamps reach the topology monitor, and a slow ring of three ranks is probed until the slow pair is
named (consensus over k steps), the same on every rank."""

from __future__ import annotations

from tests.launch import run_ranks

DELAY_MS = 40.0


def _ring_of_three(rank: int, world: int) -> list[tuple]:
    import torch
    import torch.distributed as dist

    from titan_morph.comm.clock import sync_clock
    from titan_morph.comm.emulator import collectives
    from titan_morph.monitor.detect import DetectRule
    from titan_morph.monitor.topology import Layout, TopologyMonitor
    from titan_morph.runtime.hybrid import HybridExchange

    collectives.register()
    collectives.configure(None, collectives.PairDelays({(0, 1): DELAY_MS}))
    collectives.set_step(1)
    dp = dist.new_group([0, 1, 2], backend=collectives.BACKEND)
    alone = [dist.new_group([r]) for r in range(world)]  # one stage per "pipeline": a 1 x 3 layout
    clock = sync_clock(None)
    # a pair is slow above half the injected delay: a loaded host's gloo latency stays under it (at the
    # default 5 ms floor, a healthy pair read slow for two steps with a busy loop on each core)
    rule = DetectRule(detect_steps=2, floor_ms=DELAY_MS / 2)
    topology = TopologyMonitor(Layout.identity(1, 3), rule, policy="off")
    exchange = HybridExchange(alone[rank], 1, topology=topology, epoch=clock.epoch, dp_group=dp)
    seen = []
    for step in range(4):
        dist.all_reduce(torch.ones(1), group=dp)  # the step's DP collective: 4 ring steps of 40 ms
        rows = exchange.all_gather([float(rank), float(step)], step)
        estimates = {pair: sorted(est.exact) for pair, est in topology.estimates.items()}
        slow = [topology.pairs[i] for i, link in enumerate(topology.detector.links) if link.slow]
        seen.append((rows, topology.suspects(), estimates, slow, exchange.probes, topology.medians.get(0)))
    return seen


def test_a_slow_ring_is_probed_until_the_pair_is_named():
    res = run_ranks(_ring_of_three, 3, timeout=90)
    assert all(r == res[0] or [x[1:4] for x in r] == [x[1:4] for x in res[0]] for r in res)  # one decision
    for rank, seen in enumerate(res):
        rows, suspects, estimates, slow, probes, median = seen[0]
        assert rows == [[float(rank), 0.0]]  # this "pipeline"'s own row back
        # the ring's per-hop delay: the injected one, plus gloo's own latency and the host's load (a
        # probe read 61 ms with a busy loop on each core); two hops' worth would be the wrong reading
        assert DELAY_MS - 2 <= median < 2 * DELAY_MS
        assert suspects == [(0, 1, 2)] and not estimates and probes == 1
        _, _, estimates, slow, _, _ = seen[1]
        assert DELAY_MS - 2 <= estimates[(0, 1)][0] < 2 * DELAY_MS
        assert max(estimates[(0, 2)] + estimates[(1, 2)]) < DELAY_MS / 2
        assert slow == []  # one slow step so far (k = 2)
        assert seen[2][3] == [(0, 1)] and seen[3][3] == [(0, 1)]
