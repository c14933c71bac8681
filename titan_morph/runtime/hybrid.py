"""DP x PP: the one per-step exchange widened to the whole world, and the pair probes.

With data parallelism every pipeline stage has replicas on other ranks, and the orchestrator needs
a world-wide view: which DP group's collectives were slow, on which host pair. Instead of a second
per-step collective, :class:`HybridExchange` appends each rank's DP collective stamps
(:mod:`titan_morph.comm.emulator.collectives`, on the common clock) to its pipeline row and all-gathers the
rows over the world. Every rank then

* hands its own pipeline's rows to the pipeline's monitor exactly as :class:`StepExchange` does
  (plan check, Eq. 1 detection, re-planning per pipeline), and
* feeds every rank's DP stamps to the :class:`~titan_morph.monitor.topology.TopologyMonitor`, which
  reaches the same decision everywhere, and
* with microbatches moved between replicas (:mod:`.replicas`), every rank's op time to the
  rebalancer, which reaches the same split everywhere.

When the monitor finds a DP group of more than two ranks slow, the group's members probe its
ring after the exchange: one small message over each ring pair, through the same emulated group,
whose stamps arrive with the next step's rows and tell the pairs apart.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from titan_morph.comm.emulator import collectives
from titan_morph.comm.emulator.collectives import CollectiveRecord
from titan_morph.comm.groups import cpu_group
from titan_morph.comm.timeouts import DEFAULT_TIMEOUTS, CommTimeouts
from titan_morph.monitor.compute import op_time_ms
from titan_morph.monitor.profile import decode
from titan_morph.monitor.topology import (
    CollectiveStamp,
    Move,
    TopologyMonitor,
    decode_stamps,
    encode_stamps,
)
from titan_morph.runtime.exchange import StepExchange
from titan_morph.runtime.replicas import ReplicaSplit

__all__ = ["HybridExchange", "slowest_of_lanes", "stamps_of"]

logger = logging.getLogger(__name__)
NAN = float("nan")
PROBE_TAG = 0x7D11


def stamps_of(records: list[CollectiveRecord], epoch: float) -> list[CollectiveStamp]:
    """The DP backend's records as stamps on the common clock (ms since ``epoch``)."""

    def ms(t: float | None) -> float:
        return NAN if t is None else (t - epoch) * 1e3

    return [
        CollectiveStamp(r.ranks, r.ordinal, r.seq, r.steps, ms(r.start_s or r.issued_s), ms(r.released_s), r.peer)
        for r in records
    ]


def slowest_of_lanes(op_ms: list[float | None], lanes: int) -> list[float | None]:
    """Every world rank's op time, TP lanes folded: one per (stage, replica), its slowest lane's
    (TorchTitan places the TP ranks of a stage innermost: consecutive global ranks)."""
    if lanes == 1:
        return op_ms
    out: list[float | None] = []
    for i in range(0, len(op_ms), lanes):
        known = [t for t in op_ms[i : i + lanes] if t is not None]
        out.append(max(known) if known else None)
    return out


class HybridExchange(StepExchange):
    """The per-step exchange of one pipeline stage, gathered over the whole world.

    Args:
        pipeline_group: this rank's pipeline (its stages' rows are what :meth:`gather` returns).
        microbatches: N (the pipeline row's width, with ``stages_per_rank``).
        topology: the orchestrator's monitor, fed every rank's DP stamps after each step.
        epoch: the common clock's t = 0 on this rank (the same instant on every rank of the world).
        dp_group: this stage's DP group on the DP backend (for probes; None: never probe).
        capacity: DP stamps a rank reports per step (the newest; older ones are counted as dropped).
        moves_before: topology moves made before this launch (``morph/topology_changes`` counts on).
        interface: the network interface of the exchange's gloo groups ("" = torch's choice).
        replicas: this replica's share of the global batch, whose rebalancer every rank's op time
            feeds after each step (None: the split stays even).
        timeouts: the job's ``[comm]`` timeouts: they bound the gloo groups made here (and the
            replicas' group, switched with them) and the probes.
        lanes: the TP degree; with more than one, ``pipeline_group`` holds every lane of every
            stage of this pipeline replica, whose rows the monitor reads folded per stage.
    """

    def __init__(
        self,
        pipeline_group: dist.ProcessGroup,
        microbatches: int,
        *,
        topology: TopologyMonitor,
        epoch: float,
        dp_group: dist.ProcessGroup | None = None,
        capacity: int = 64,
        moves_before: int = 0,
        stages_per_rank: int = 1,
        interface: str = "",
        replicas: ReplicaSplit | None = None,
        timeouts: CommTimeouts = DEFAULT_TIMEOUTS,
        lanes: int = 1,
    ) -> None:
        super().__init__(pipeline_group, microbatches, stages_per_rank, interface, timeouts, lanes)
        self.replicas = replicas
        world = dist.group.WORLD
        if world is None:  # torch types WORLD as optional: it is None before init_process_group
            raise RuntimeError("HybridExchange: torch.distributed has no default process group")
        self.world = cpu_group(world, interface, timeouts)
        self.groups.append(self.world)
        if replicas is not None and replicas.group is not None:
            self.groups.append(replicas.group)
        self.pipeline_ranks = dist.get_process_group_ranks(pipeline_group)
        self.row_ranks = self.pipeline_ranks
        self.topology = topology
        self.epoch = epoch
        self.dp_group = dp_group
        self.capacity = capacity
        self.probes = 0
        self.moves_before = moves_before
        self.applied = False  # set by whoever carries the move out (the trainer)

    @property
    def move(self) -> Move | None:
        """The orchestrator's decision, once made (the same on every rank)."""
        return self.topology.move

    def tensorboard_metrics(self, step: int) -> dict[str, float]:
        """The topology monitor's scalars and ``morph/topology_changes`` (moves so far, this one included)."""
        out = self.topology.metrics()
        out["morph/topology_changes"] = float(self.moves_before + (self.move is not None))
        if self.replicas is not None:
            out.update(self.replicas.metrics())
        return out

    def all_gather(self, row: list[float], step: int) -> list[list[float]]:
        """Gather ``row`` + this rank's DP stamps over the world; return this pipeline's rows and
        feed the topology monitor every rank's stamps."""
        self.enter_step(step)
        stamps = stamps_of(collectives.take_records(), self.epoch)
        width = len(row)
        mine = torch.tensor(row + encode_stamps(stamps, self.capacity), dtype=torch.float64)
        values = [r.tolist() for r in self.gather_on(self.world, mine, step)]
        if self.lanes == 1:  # the topology's layout is one rank per host: with TP lanes it measures nothing
            decoded = [decode_stamps(v[width:]) for v in values]
            self.topology.observe(step + 1, [s for s, _ in decoded], dropped=sum(d for _, d in decoded))
        if self.replicas is not None:
            op_ms = [op_time_ms(decode(v[:width], self.stages_per_rank)) for v in values]
            self.replicas.observe(step + 1, slowest_of_lanes(op_ms, self.lanes))
        self._probe(step)
        return [values[r][:width] for r in self.pipeline_ranks]

    def _probe(self, step: int) -> None:
        """Members of a slow DP group of more than two ranks time one message over each ring pair."""
        group = self.dp_group
        if group is None:
            return
        ranks = dist.get_process_group_ranks(group)
        if tuple(ranks) not in self.topology.suspects():
            return
        me = ranks.index(dist.get_rank())
        n = len(ranks)
        out, into = torch.zeros(1), torch.zeros(1)
        t0 = time.monotonic()
        works = [
            dist.isend(out, group=group, group_dst=(me + 1) % n, tag=PROBE_TAG),
            dist.irecv(into, group=group, group_src=(me - 1) % n, tag=PROBE_TAG),
        ]
        bound = timedelta(seconds=self.timeouts.for_step(step + 1))
        for work in works:
            if work is not None:  # None only on a rank outside ``group``, which this one is not
                work.wait(bound)
        self.probes += 1
        logger.debug("titan_morph: probed DP ring %s in %.1f ms", ranks, (time.monotonic() - t0) * 1e3)
