"""The one per-step exchange between the pipeline's ranks.

After every step each stage packs its :class:`~titan_morph.runtime.records.StepRecord` into one
fixed-size row (:mod:`titan_morph.monitor.profile`) and the stages all-gather the rows: small
point-to-point messages on a CPU group (:func:`~titan_morph.comm.groups.gather_rows`: not a
collective, which torch's flight recorder would keep every step), no external service. Every rank
then holds every stage's view of the step, on the pipeline's common clock, and uses it for three
things:

* the plan check -- every stage ran the same plan (:class:`PlanMismatchError` otherwise);
* the monitor's detection and re-planning (the same data on every rank gives the same decision);
* the TensorBoard figures that need all stages (pipeline time, per-stage idle time, latencies).

Each wait of the gather is bounded by TorchTitan's ``[comm]`` timeouts: ``init_timeout_seconds``
in step 1, ``train_timeout_seconds`` from step 2 on (:meth:`StepExchange.gather_on`). The rare
collectives (:meth:`StepExchange.agree`) follow the group's own timeout: the pipeline group's, which
TorchTitan shortens, or the CPU group made for it, shortened the same way from step 2.
"""

from __future__ import annotations

import logging
from collections import Counter

import torch
import torch.distributed as dist

from titan_morph.comm.groups import cpu_group, gather_rows, step_timeout
from titan_morph.comm.recorded import ProbeTimes
from titan_morph.comm.timeouts import DEFAULT_TIMEOUTS, CommTimeouts
from titan_morph.monitor.lanes import stages_of_lanes
from titan_morph.monitor.profile import PROBE_PATH, MessageStamp, StepProfile, decode, encode
from titan_morph.runtime.records import StepRecord

__all__ = ["PlanMismatchError", "StepExchange", "plan_number", "probe_stamps", "step_profile"]

logger = logging.getLogger(__name__)
NAN = float("nan")


class PlanMismatchError(RuntimeError):
    """Ranks of one pipeline installed different plans: running on would deadlock."""


def plan_number(plan_id: str) -> int:
    """A plan id (12 hex digits) as an integer: exact in a float64 row and in a TensorBoard scalar's
    first 6 digits (:func:`titan_morph.runtime.metrics.plan_scalar`)."""
    return int(plan_id, 16)


def step_profile(record: StepRecord, stage: int, epoch: float) -> StepProfile:
    """This rank's row of the exchange (``stage``: its index in the pipeline group): ``record`` with
    every time on the common clock (ms since ``epoch``), and its per-stage compute when it runs
    several stages. Refused or failed messages are left out (no delivery to time)."""

    def ms(value: float | None) -> float:
        return NAN if value is None else value

    counts = Counter(kind for kind, *_ in record.op_ms)
    prof = StepProfile(
        stage,
        record.step,
        (record.start_s - epoch) * 1e3,
        (record.end_s - epoch) * 1e3,
        {kind: (total, counts[kind]) for kind, total in record.compute_ms.items()},
        plan=plan_number(record.plan_id),
        blocked_ms=sum(record.blocked_ms.values()),
        send_late_ms=sum(record.send_late_ms),
        sends=len(record.send_late_ms),
        failovers=record.failovers,
        stage_compute={s: dict(kinds) for s, kinds in record.stage_compute.items()},
    )
    for msg in record.messages:
        if msg.status in ("down", "error"):
            continue
        if msg.side == "send":
            accepted = msg.accepted if msg.accepted is not None else msg.issued
            if msg.ready is not None:  # CUDA: the link starts when the sender's device had the payload
                accepted = max(accepted, msg.ready)
            stamp = MessageStamp(
                "send", msg.path, msg.link, msg.direction, msg.seq, accepted, ms(msg.planned), nbytes=msg.nbytes
            )
        else:
            stamp = MessageStamp(
                "recv",
                msg.path,
                msg.link,
                msg.direction,
                msg.seq,
                ms(msg.arrived),
                ms(msg.waited),
                ms(msg.completed),
                msg.nbytes,
            )
        prof.messages.append(stamp)
    return prof


def probe_stamps(times: ProbeTimes) -> list[MessageStamp]:
    """One side of a rate probe's train as message stamps (path :data:`PROBE_PATH`, its own
    sequence numbers): the sender's acceptance, the receiver's wait and its return."""
    common = (PROBE_PATH, times.link, times.direction)
    if times.sent:
        return [MessageStamp("send", *common, k, t, nbytes=times.nbytes) for k, t in enumerate(times.sent)]
    return [
        MessageStamp("recv", *common, k, NAN, w, r, times.nbytes)
        for k, (w, r) in enumerate(zip(times.waited, times.returned, strict=True))
    ]


class StepExchange:
    """All-gathers one :class:`StepProfile` row per rank of ``group`` (on a CPU group, bound to
    ``interface`` when one is given: ``[morph] host_ifnames``); each rank runs ``stages_per_rank`` stages.
    ``timeouts``: the job's ``[comm]`` timeouts, which bound a CPU group made here.

    With tensor parallelism (``lanes`` = the TP degree) ``group`` holds every rank of every stage's
    lanes, and :meth:`gather` gives one row per stage: its lanes folded into the slowest one
    (:func:`~titan_morph.monitor.lanes.slowest_lane`), the same on every rank of every lane."""

    def __init__(
        self,
        group: dist.ProcessGroup,
        microbatches: int,
        stages_per_rank: int = 1,
        interface: str = "",
        timeouts: CommTimeouts = DEFAULT_TIMEOUTS,
        lanes: int = 1,
    ) -> None:
        self.group = cpu_group(group, interface, timeouts)
        self.timeouts = timeouts
        self.groups = [self.group]  # the groups whose timeout follows the step (:meth:`enter_step`)
        self._training = False
        self.microbatches = microbatches
        self.stages_per_rank = stages_per_rank
        self.lanes = lanes
        self.size = dist.get_world_size(self.group)
        self.row_ranks: list[int] = dist.get_process_group_ranks(self.group)  # whose rows all_gather returns

    def gather(self, prof: StepProfile) -> list[StepProfile]:
        """Every rank's profile of this step, ordered by rank; checks that they ran one plan."""
        row = encode(prof, self.microbatches, self.stages_per_rank)
        if prof.dropped:
            logger.warning(
                "titan_morph: stage %d step %d: %d message stamps did not fit the exchange row",
                prof.stage,
                prof.step,
                prof.dropped,
            )
        rows = self.all_gather(row, prof.step)
        decoded = [decode(r, self.stages_per_rank) for r in rows]
        if len({p.plan for p in decoded}) != 1:
            ran = ", ".join(f"stage {p.stage} (rank {r}): {p.plan:012x}" for p, r in zip(decoded, self.row_ranks))
            raise PlanMismatchError(f"step {prof.step + 1}: pipeline ranks ran different plans ({ran})")
        order = sorted(range(len(decoded)), key=lambda i: (decoded[i].stage, self.row_ranks[i]))  # stable lanes
        profiles = [decoded[i] for i in order]
        return stages_of_lanes(profiles, self.lanes) if self.lanes > 1 else profiles

    def all_gather(self, row: list[float], step: int) -> list[list[float]]:
        """The gather itself: every stage's row (``step``: the 0-based step they describe)."""
        self.enter_step(step)
        mine = torch.tensor(row, dtype=torch.float64)
        return [r.tolist() for r in self.gather_on(self.group, mine, step)]

    def gather_on(self, group: dist.ProcessGroup, mine: torch.Tensor, step: int) -> list[torch.Tensor]:
        """Every rank's ``mine`` on ``group`` (:func:`gather_rows`), each wait bounded by the ``[comm]``
        timeout of TorchTitan step ``step + 1``."""
        return gather_rows(group, mine, self.timeouts.for_step(step + 1), f"the exchange of step {step + 1}")

    def enter_step(self, step: int) -> None:
        """Once past TorchTitan's step 1 (``step``: 0-based), bound :attr:`groups` by ``train_s``."""
        if self._training or step < 1:
            return
        self._training = True
        for group in self.groups:
            step_timeout(group, self.timeouts, step + 1)

    def agree_max(self, value: float) -> float:
        """Collective: the largest of every rank's ``value`` (one number every rank then decides on,
        e.g. the relaunch cost each measured)."""
        mine = torch.tensor([value], dtype=torch.float64)
        gathered = [torch.zeros_like(mine) for _ in range(self.size)]
        dist.all_gather(gathered, mine, group=self.group)
        return max(float(t.item()) for t in gathered)

    def agree(self, plan_id: str) -> None:
        """Collective: raise :class:`PlanMismatchError` on every rank unless all hold ``plan_id``."""
        mine = torch.tensor([plan_number(plan_id)], dtype=torch.int64)
        gathered = [torch.zeros_like(mine) for _ in range(self.size)]
        dist.all_gather(gathered, mine, group=self.group)
        ids = [f"{int(t.item()):012x}" for t in gathered]
        if len(set(ids)) != 1:
            raise PlanMismatchError(f"pipeline ranks installed different plans: {ids} (this rank: {plan_id})")
